"""``triton_python_backend_utils`` for model.py files written for Triton's Python backend.

A worker registers this module under that name before it imports a model, so
``import triton_python_backend_utils as pb_utils`` works unchanged. It has the part of Triton's API that
a non-decoupled model uses: requests and their input tensors, tensors, responses, errors, the config
helpers and the logger. Tensors live on the host (``as_numpy``), as in Triton's default. Not here yet:
decoupled response senders and ``auto_complete_config``; using them
raises :class:`TritonModelException` saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "triton_string_to_numpy",
]

log = logging.getLogger("triton_python_backend_utils")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

NpArray = npt.NDArray[Any]


class TritonModelException(Exception):
    """Raised by a model's ``execute`` to fail the whole batch with its message."""


class TritonError(Exception):
    """An error for one response: ``InferenceResponse(error=TritonError("message"))``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg: str, code: int = INTERNAL) -> None:
        super().__init__(msg)
        self._message = str(msg)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named host tensor: ``Tensor("OUTPUT0", np.array(...))``."""

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"Tensor name must be a string, got {type(name).__name__}")
        self._name = name
        self._array: NpArray = _host_array(data, name)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> NpArray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from an object with ``__dlpack__`` (a NumPy or CuPy array); device data is copied."""
        return Tensor(name, capsule)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def _host_array(data: Any, name: str) -> NpArray:
    if isinstance(data, np.ndarray):
        return data
    get = getattr(data, "get", None)  # a CuPy array
    if callable(get) and hasattr(data, "__cuda_array_interface__"):
        return np.asarray(get())
    if hasattr(data, "__dlpack__"):
        try:
            return np.from_dlpack(data)
        except (TypeError, RuntimeError, BufferError):
            pass
    try:
        return np.asarray(data)
    except Exception as exc:
        raise TritonModelException(f"Tensor {name!r}: cannot use {type(data).__name__} as an array") from exc


class InferenceRequest:
    """One request of a batch: its input tensors, id and requested outputs."""

    def __init__(
        self,
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int = -1,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._inputs = list(inputs)
        self._by_name = {t.name(): t for t in self._inputs}
        self._request_id = request_id
        self._outputs = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

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

    def parameters(self) -> str:
        return self._parameters

    def model_name(self) -> str:
        return self._model_name

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> Any:
        raise TritonModelException("decoupled models (response senders) are not supported yet in zinfer")

    def exec(self, *args: Any, **kwargs: Any) -> InferenceResponse:
        """BLS: run this request on ``model_name`` through the server; errors come back as values."""
        from . import bls

        try:
            outputs = bls.infer(
                self._model_name,
                {t.name(): t.as_numpy() for t in self._inputs},
                self._outputs or None,
                max(self._model_version, 0),
                self._timeout / 1e6 if self._timeout else bls.BLS_TIMEOUT_S,
            )
        except Exception as exc:
            return InferenceResponse(error=TritonError(f"{type(exc).__name__}: {exc}"))
        return InferenceResponse(output_tensors=[Tensor(name, value) for name, value in outputs.items()])

    async def async_exec(self, *args: Any, **kwargs: Any) -> InferenceResponse:
        """``exec`` without blocking the event loop: several may be awaited at once."""
        import asyncio

        return await asyncio.to_thread(self.exec)


class InferenceResponse:
    """The answer to one request: output tensors, or an error for that request alone."""

    def __init__(
        self, output_tensors: Iterable[Tensor] | None = None, error: TritonError | str | None = None
    ) -> None:
        self._tensors = list(output_tensors or ())
        self._error = TritonError(error) if isinstance(error, str) else error

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request._by_name.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def _config_by_name(model_config: dict[str, Any] | str, key: str, name: str) -> dict[str, Any] | None:
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    for entry in config.get(key, ()):
        if entry.get("name") == name:
            return dict(entry)
    return None


def get_input_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "output", name)


_NUMPY_BY_TYPE: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``numpy.float32``; ``TYPE_STRING`` -> ``numpy.object_``."""
    if triton_type_string == "TYPE_BF16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    try:
        return _NUMPY_BY_TYPE[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown data type {triton_type_string!r}") from None


class Logger:
    """Triton's model logger; lines go to the worker's log (logger ``triton_python_backend_utils``)."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        log.log(level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", message)
