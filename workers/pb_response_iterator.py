"""``pb_utils.ResponseIterator``: the responses of a BLS call to a decoupled model, as they come.

``InferenceRequest.exec(decoupled=True)`` returns one (``async_exec`` once its first response is in); it
iterates both ways (``for`` and ``async for``) and ``cancel()`` asks the called model to stop. The request
hands it the call's id and how to open and cancel the call (``bls.stream``, ``bls.cancel``), so this module
knows nothing of requests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .pb_errors import TritonError, triton_error
from .pb_response import InferenceResponse
from .pb_tensor import Tensor

__all__ = ["ResponseIterator", "Stream"]

Stream = Iterator[tuple[dict[str, Any], bool, dict[str, Any]]]
"""A decoupled call's responses as ``bls.stream`` yields them: (outputs, final, parameters)."""

_END = object()


class ResponseIterator:
    """The responses of a BLS call to a decoupled model, as they come, for ``for`` and ``async for``.
    The stream starts on the first ``next``; an error ends it as a last response that carries it.
    ``cancel()`` asks the called model to stop (its ``request.is_cancelled()`` turns true); the responses
    it still sends, usually a CANCELLED error, keep coming until its final one, as in Triton."""

    def __init__(
        self, call_id: str, open_stream: Callable[[str], Stream], cancel_call: Callable[[str], object]
    ) -> None:
        self._call_id = call_id
        self._open_stream = open_stream  # makes the call, on the first ``next``
        self._cancel_call = cancel_call
        self._stream: Stream | None = None
        self._done = False
        self._lock = threading.Lock()
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
        self._cancelled = True
        if self._stream is not None and not self._done:
            self._cancel_call(self._call_id)

    def _prefetch(self) -> None:
        self._first = self._next()

    def _take(self) -> object:
        item, self._first = self._first, None
        return item if item is not None else self._next()

    def _next(self) -> object:
        with self._lock:
            if self._done:
                return _END
            try:
                if self._stream is None:
                    if self._cancelled:
                        self._done = True
                        return InferenceResponse(
                            error=TritonError("Request was cancelled", TritonError.CANCELLED)
                        )
                    self._stream = self._open_stream(self._call_id)
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
