"""The neutral records the front door's protocol layers exchange with the ``Bridge``.

Neither protobuf nor JSON: the gRPC and HTTP layers each turn their wire form into these and back. Data
types are KServe v2 names (``FP32``, ``BYTES``, ...); versions are Triton's strings (``""`` is the newest
ready version); tensor data is a NumPy array (an object array of ``bytes`` for ``BYTES``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

NONE: Mapping[str, Any] = MappingProxyType({})

# Tensor, InferCall and InferReply are made for every request, several times over: named tuples, as the
# wire records of ``zinfer.client.protocol`` (several times cheaper to build than frozen dataclasses).


class Tensor(NamedTuple):
    """One input or output: ``data`` has ``shape`` and the NumPy dtype of ``datatype``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any]


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as model metadata lists it (``-1`` for a variable dim, batch dim included)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class Duration:
    count: int
    ns: int


@dataclass(frozen=True)
class BatchStat:
    """How many batches of ``batch_size`` ran (zinfer counts executions per size, not their durations)."""

    batch_size: int
    count: int


@dataclass(frozen=True)
class ModelStatistics:
    """Triton's statistics extension for one model version. ``durations`` holds ``success``, ``fail``,
    ``queue``, ``compute_input``, ``compute_infer``, ``compute_output``, ``cache_hit`` and ``cache_miss``."""

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    durations: Mapping[str, Duration]
    batch_stats: tuple[BatchStat, ...]


@dataclass(frozen=True)
class RepositoryModel:
    """One entry of the repository index: ``state`` is Triton's (``READY``, ``UNAVAILABLE``, ``LOADING``,
    or ``""`` when not loaded)."""

    name: str
    version: str
    state: str
    reason: str


class InferCall(NamedTuple):
    """One inference request. ``outputs`` names the outputs wanted (empty: all of them); ``timeout_us``
    0 means the model's default; ``sequence_id`` 0 or ``""`` means no sequence."""

    model: str
    inputs: tuple[Tensor, ...]
    version: str = ""
    outputs: tuple[str, ...] = ()
    request_id: str = ""
    priority: int = 0
    timeout_us: int = 0
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    parameters: Mapping[str, Any] = NONE  # the request's parameters (the model's, and the door's own)
    # outputs asked for as their top classes (Triton's classification extension): {output: class count}
    class_counts: Mapping[str, int] = NONE
    traceparent: str = ""  # the caller's W3C trace context (header or metadata), for the server's trace


class InferReply(NamedTuple):
    """One response: the only one of a plain model, or one of a decoupled model's stream (``final`` marks
    the last; a decoupled model's final response may hold no outputs)."""

    model: str
    version: str
    request_id: str
    outputs: tuple[Tensor, ...]
    final: bool = True
    parameters: Mapping[str, Any] = NONE  # the response's (a Triton model's)
    trace: str = ""  # the broker traced the request: its trace's token (``door_trace``)

    def output(self, name: str) -> Tensor | None:
        return next((t for t in self.outputs if t.name == name), None)


def array_bytes(data: npt.NDArray[Any]) -> memoryview:
    """A numeric tensor's raw bytes, without a copy where the array is contiguous (what both doors put on
    the wire: gRPC's raw contents, HTTP's binary parts, the broker's frames)."""
    if data.flags.c_contiguous:
        try:
            return data.data.cast("B")  # the array's own bytes, without a reshape and a view
        except (TypeError, ValueError, NotImplementedError):  # a dtype the buffer protocol cannot name
            pass
    else:
        data = np.ascontiguousarray(data)
    return data.reshape(-1).view(np.uint8).data
