"""``pb_utils.ResponseIterator``: the responses of a BLS call to a decoupled model, as they come.

``InferenceRequest.exec(decoupled=True)`` returns one (``async_exec`` once its first response is in); it
iterates both ways (``for`` and ``async for``) and ``cancel()`` asks the called model to stop.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .pb_errors import TritonError, triton_error
from .pb_request import InferenceResponse
from .pb_tensor import Tensor

if TYPE_CHECKING:
    from .pb_request import InferenceRequest

__all__ = ["ResponseIterator"]

_END = object()


class ResponseIterator:
    """The responses of a BLS call to a decoupled model, as they come, for ``for`` and ``async for``.
    The stream starts on the first ``next``; an error ends it as a last response that carries it.
    ``cancel()`` asks the called model to stop (its ``request.is_cancelled()`` turns true); the responses
    it still sends, usually a CANCELLED error, keep coming until its final one, as in Triton."""

    def __init__(self, request: InferenceRequest) -> None:
        self._request = request
        self._stream: Iterator[tuple[dict[str, Any], bool, dict[str, Any]]] | None = None
        self._done = False
        self._lock = threading.Lock()
        self._call_id = request._request_id or f"bls-{uuid.uuid4().hex}"
        self._cancelled = False
        self._first: object = None  # the response ``_prefetch`` took, not yet handed out

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        item = self._take()
        if item is _END:
            raise StopIteration
        assert isinstance(item, InferenceResponse)
        return item

    def __aiter__(self) -> ResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        item = self._first if self._first is not None else await asyncio.to_thread(self._take)
        self._first = None
        if item is _END:
            raise StopAsyncIteration
        assert isinstance(item, InferenceResponse)
        return item

    def cancel(self) -> None:
        """Cancel the call (from the loop over its responses or from another thread); a no-op once it
        ended. Before the first response is asked for, the call is not made at all."""
        from . import bls

        self._cancelled = True
        if self._stream is not None and not self._done:
            bls.cancel(self._call_id)

    def _prefetch(self) -> None:
        self._first = self._next()

    def _take(self) -> object:
        item, self._first = self._first, None
        return item if item is not None else self._next()

    def _next(self) -> object:
        from . import bls

        with self._lock:
            if self._done:
                return _END
            r = self._request
            try:
                if self._stream is None:
                    if self._cancelled:
                        self._done = True
                        return InferenceResponse(
                            error=TritonError("Request was cancelled", TritonError.CANCELLED)
                        )
                    version = max(r._model_version, 0)
                    self._stream = bls.stream(r.model_name, r._arrays(), r._outputs or None, version,
                                              r._timeout_s(), r._parameters, self._call_id)  # fmt: skip
                outputs, final, parameters = next(self._stream)
            except StopIteration:
                self._done = True
                return _END
            except Exception as exc:
                self._done = True
                return InferenceResponse(error=triton_error(exc))
            self._done = final
            return InferenceResponse(
                [Tensor(name, value) for name, value in outputs.items()], None, parameters
            )
