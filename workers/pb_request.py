"""``pb_utils.InferenceRequest`` and ``InferenceResponseSender`` (``InferenceResponse`` is ``pb_response``'s).

A request the worker hands to ``execute`` carries its inputs, ids, parameters, a cancellation flag the
worker sets when the client cancels, and its response sender. A request a model builds itself is a BLS
call: ``exec()`` / ``async_exec()`` run it on another model through the server (``zinfer.workers.bls``)
and return errors as values (``response.has_error()``), as Triton does; with ``decoupled=True`` they
return the stream's responses as an iterator (the last may be empty: it carries only the end).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import bls
from .cancel_flags import CancelFlag
from .pb_errors import ArgumentTypeError, TritonModelException, triton_error
from .pb_response import InferenceResponse, checked_parameters
from .pb_response_iterator import ResponseIterator, Stream
from .pb_tensor import Tensor
from .pb_trace import NO_TRACE, InferenceTrace

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class _ModelName(str):
    """A request's model name: Triton has it both as ``request.model_name`` and ``request.model_name()``."""

    def __call__(self) -> str:
        return str(self)


_SERVED_NAMES: dict[str, _ModelName] = {}


def _served_name(name: str) -> _ModelName:
    """The ``model_name`` of the requests given to ``execute``: one object per model, not per request."""
    served = _SERVED_NAMES.get(name)
    if served is None:
        served = _SERVED_NAMES[name] = _ModelName(name)
    return served


Deliver = Callable[[InferenceResponse | None, bool], None]


class InferenceResponseSender:
    """Sends a request's responses, from ``execute`` or any thread after it returned. Decoupled models send
    any number, the last with ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (or only the flag); other
    models exactly one, then the flag. Sending after the final flag raises ``TritonModelException``."""

    def __init__(self, deliver: Deliver, cancelled: CancelFlag, decoupled: bool) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                "InferenceResponseSender.send takes a pb_utils.InferenceResponse, "
                f"got {type(response).__name__}"
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled and response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if not self._decoupled and response is None and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before "
                    "sending a response."
                )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._closed = final
            self._sent += 1
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _close(self) -> None:
        """The request was answered otherwise (execute returned its response): later sends raise."""
        with self._lock:
            self._closed = True


class InferenceRequest:
    """A request: one given to ``execute``, or one a model builds to call another model (BLS)."""

    def __init__(
        self,
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        requested_output_names: Sequence[str] = (),
        model_name: str | bytes = "",
        model_version: int = -1,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        tensors = list(inputs)  # None: TypeError, as Triton
        if not isinstance(request_id, str):
            raise ArgumentTypeError(f"InferenceRequest: request_id must be a str, not {type(request_id)}")
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            kind = type(correlation_id).__name__
            raise ArgumentTypeError(f"InferenceRequest: correlation_id must be an int or a str, not {kind}")
        if not all(isinstance(t, Tensor) for t in tensors):
            raise TritonModelException("InferenceRequest: inputs must be a list of pb_utils.Tensor")
        outputs = [_text(n, "requested_output_names") for n in requested_output_names]
        name = _ModelName(_text(model_name, "model_name"))
        params = checked_parameters(parameters, "InferenceRequest")
        if isinstance(trace, InferenceTrace) and trace.get_context():  # the server traces it as a child
            params["traceparent"] = trace.get_context()
        self._fill(tensors, request_id, outputs, name, int(model_version), correlation_id, int(flags),
                   int(timeout), params, CancelFlag())  # fmt: skip

    def _fill(  # ``_served`` sets the same attributes itself: keep the two alike
        self,
        inputs: list[Tensor],
        request_id: str,
        outputs: list[str],
        model_name: _ModelName,
        model_version: int,
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters: dict[str, Any],
        cancelled: CancelFlag,
        by_name: dict[str, Tensor] | None = None,
    ) -> None:
        """Every attribute of a request, from values already checked (``__init__`` or ``_served``);
        ``by_name``: the inputs by name, when the caller has them so already."""
        self._inputs = inputs
        self._by_name = {t._name: t for t in inputs} if by_name is None else by_name
        self._trace = NO_TRACE
        self._request_id = request_id
        self._outputs = outputs
        self.model_name = model_name
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters
        self._cancelled = cancelled
        self._sender: InferenceResponseSender | None = None
        # made on first ask: ``_make_sender(_slot, _cancelled)`` (the worker's, for a request it serves)
        self._make_sender: Callable[[int, CancelFlag], InferenceResponseSender] | None = None
        self._slot = 0
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _served(
        cls,
        inputs: Iterable[Tensor],
        request_id: str,
        requested_output_names: Sequence[str],
        model_name: str,
        correlation_id: int | str = 0,
        flags: int = 0,
        parameters: Mapping[str, Any] | None = None,
        cancelled: CancelFlag | None = None,
        by_name: dict[str, Tensor] | None = None,
    ) -> InferenceRequest:
        """A request the worker hands to ``execute`` (its sender is attached by the worker). What the
        worker gives was checked on its way in (tensors, names, parameters), so the object is filled in
        without the checks ``__init__`` makes of a model's own (BLS) requests: this runs per request.
        ``by_name``: the same tensors by name (the worker builds them so), kept as the request's own."""
        request = cls.__new__(cls)
        context = None
        if parameters:
            params = dict(parameters)
            context = params.pop("traceparent", None)  # a traced request's: ``trace()``, not a parameter
        else:
            params = {}
        # ``_fill``'s attributes set here, without its call: this runs for every request given to execute
        tensors = list(inputs)
        request._inputs = tensors
        request._by_name = {t._name: t for t in tensors} if by_name is None else by_name
        request._trace = NO_TRACE if not isinstance(context, str) else InferenceTrace(context)
        request._request_id = request_id
        request._outputs = list(requested_output_names)
        request.model_name = _served_name(model_name)
        request._model_version = -1
        request._correlation_id = correlation_id
        request._flags = flags
        request._timeout = 0
        request._parameters = params
        request._cancelled = cancelled if cancelled is not None else CancelFlag()
        request._sender = None
        request._make_sender = None
        request._slot = 0
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def trace(self) -> InferenceTrace:
        """The request's trace, for a BLS call to continue (``InferenceRequest(..., trace=request.trace())``,
        as in Triton); an untraced request's is empty and a call given it is not traced for it."""
        return self._trace

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def request_id(self) -> str:
        return self._request_id

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        """The request's parameters as JSON text (``json.loads`` it), as in Triton."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request (set while ``execute`` runs, as the cancel arrives)."""
        return self._cancelled.is_set()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None and self._make_sender is not None:
            self._sender, self._make_sender = self._make_sender(self._slot, self._cancelled), None
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender: only a request given to execute has a response sender (a request "
                "built for a BLS call answers through exec/async_exec)"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not supported by zinfer: "
                "request rescheduling needs iterative sequence batching, which zinfer does not have"
            )
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(f"set_release_flags: unknown flags {flags!r}")
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on ``model_name`` through the server. Errors come back as a response
        whose ``has_error()`` is true; ``decoupled=True`` returns an iterator of the stream's responses."""
        if decoupled:
            return self._responses()
        try:
            version = max(self._model_version, 0)
            outputs, parameters = bls.infer_with_parameters(
                self.model_name,
                self._arrays(),
                self._outputs or None,
                version,
                self._timeout_s(),
                **self._options(),
            )
        except Exception as exc:
            return InferenceResponse(error=triton_error(exc))
        return InferenceResponse([Tensor(name, value) for name, value in outputs.items()], None, parameters)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` without blocking the event loop: several may be awaited at once. With
        ``decoupled=True`` the result iterates both ways (``for`` and ``async for``)."""
        if decoupled:  # awaited until the first response is in, as in Triton (a plain ``for`` then waits
            iterator = self._responses()  # only for the rest, not for the call itself)
            await asyncio.to_thread(iterator._prefetch)
            return iterator
        return await asyncio.to_thread(self.exec)

    def _responses(self) -> ResponseIterator:
        """A decoupled call's responses; the call (``bls.stream``) starts on the first of them."""
        return ResponseIterator(self._request_id or f"bls-{uuid.uuid4().hex}", self._stream, bls.cancel)

    def _stream(self, call_id: str) -> Stream:
        version = max(self._model_version, 0)
        return bls.stream(self.model_name, self._arrays(), self._outputs or None, version, self._timeout_s(),
                          self._parameters, call_id)  # fmt: skip

    def _options(self) -> dict[str, Any]:
        """The call's id, parameters and, for a stateful model, its sequence (``correlation_id``,
        ``flags``)."""
        options: dict[str, Any] = {"parameters": self._parameters, "request_id": self._request_id or None}
        if self._correlation_id or self._flags:
            options["sequence_id"] = self._correlation_id
            options["sequence_start"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            options["sequence_end"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
        return options

    def _arrays(self) -> dict[str, Any]:
        return {t.name(): t.as_numpy() for t in self._inputs}

    def _timeout_s(self) -> float:
        return self._timeout / 1e6 if self._timeout > 0 else bls.BLS_TIMEOUT_S


def _text(value: Any, what: str) -> str:
    """A name given as str, or as bytes (NumPy string tensors give ``np.bytes_``), as text."""
    if isinstance(value, bytes):  # np.bytes_ is a bytes subclass
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise TritonModelException(f"InferenceRequest: {what} is not UTF-8: {value!r}") from None
    if isinstance(value, str):
        return str(value)
    raise ArgumentTypeError(f"InferenceRequest: {what} must be a str, got {type(value).__name__}")
