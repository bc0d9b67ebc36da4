"""``triton_python_backend_utils`` for model.py files written for Triton's Python backend.

A worker registers this module under that name before it imports a model, so
``import triton_python_backend_utils as pb_utils`` works unchanged. It gathers the API: requests, responses
and response senders (``pb_request``, ``pb_response``), tensors and data-type helpers (``pb_tensor``), errors
(``pb_errors``), the config helpers, the logger, BLS model loading, and the constants. What zinfer does not
do is still here by name and raises :class:`TritonModelException` saying why (docs/models.md has the
table, section by section of Triton's README).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from .pb_errors import ArgumentTypeError, TritonError, TritonModelException
from .pb_request import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponseSender,
)
from .pb_response import InferenceResponse
from .pb_response_iterator import ResponseIterator
from .pb_tensor import (
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_to_numpy_type,
)
from .pb_trace import InferenceTrace

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

log = logging.getLogger("triton_python_backend_utils")

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request._by_name.get(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def _config(model_config: dict[str, Any] | str) -> dict[str, Any]:
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    if not isinstance(config, dict):
        raise TritonModelException("the model config must be a dict (json.loads(args['model_config']))")
    return config


def _config_by_name(model_config: dict[str, Any] | str, key: str, name: str) -> dict[str, Any] | None:
    for entry in _config(model_config).get(key, ()):
        if entry.get("name") == name:
            return dict(entry)
    return None


def get_input_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    return _config_by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any] | str) -> bool:
    """Whether the config sets ``model_transaction_policy { decoupled: true }``."""
    policy = _config(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


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


class LogLevel:
    """The levels of ``Logger.log(message, level)``; VERBOSE lines are the worker's DEBUG lines."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Triton's model logger; lines go to the worker's log (logger ``triton_python_backend_utils``)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        if level not in (LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE):
            raise ArgumentTypeError(f"Logger.log: unknown level {level!r} (use pb_utils.LogLevel.INFO, ...)")
        log.log(level, "%s", _message(message))

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", _message(message))

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", _message(message))

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", _message(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", _message(message))


def _message(message: Any) -> str:
    if not isinstance(message, str):  # Triton's binding takes a str only
        raise ArgumentTypeError(f"Logger: the message must be a str, got {type(message).__name__}")
    return message


class PreferredMemory:
    """Where a BLS call's outputs should land. zinfer hands models host tensors only, so a GPU preference
    is accepted and the outputs still arrive on the host (``Tensor.is_cpu()`` says so)."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        if preferred_memory_type not in (TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED,
                                         TRITONSERVER_MEMORY_GPU):  # fmt: skip
            raise TritonModelException(f"PreferredMemory: unknown memory type {preferred_memory_type!r}")
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load a model of the repository (the server must run in explicit model control mode); ``config``
    (JSON text) replaces its config.pbtxt, ``files`` (relative path to bytes, with a config) its folder."""
    from . import bls

    try:
        bls.load_model(model_name, config, files)
    except Exception as exc:
        raise TritonModelException(
            f"load_model({model_name!r}) failed: {type(exc).__name__}: {exc}"
        ) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model of the repository; ``unload_dependents=True`` (Triton also unloads the models that
    depend on it, such as its ensembles) is refused by name rather than ignored."""
    if unload_dependents:
        raise TritonModelException(
            f"pb_utils.unload_model({model_name!r}, unload_dependents=True) is not supported by zinfer: it "
            "does not track which models depend on another; unload each dependent model by name"
        )
    from . import bls

    try:
        bls.unload_model(model_name)
    except Exception as exc:
        raise TritonModelException(
            f"unload_model({model_name!r}) failed: {type(exc).__name__}: {exc}"
        ) from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    from . import bls

    try:
        return bls.is_model_ready(model_name, model_version or 0)
    except Exception as exc:
        raise TritonModelException(
            f"is_model_ready({model_name!r}) failed: {type(exc).__name__}: {exc}"
        ) from None


# pb_utils.ModelConfig (what auto_complete_config receives) and pb_utils.MetricFamily / Metric (custom
# metrics), each defined in its own module
from .custom_metrics import Metric as Metric  # noqa: E402
from .custom_metrics import MetricFamily as MetricFamily  # noqa: E402
from .pb_model_config import ModelConfig as ModelConfig  # noqa: E402
