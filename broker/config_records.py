"""Typed, frozen records for a Triton model configuration (``model_config.proto``), and their JSON form.

Field names follow Triton's. The records hold values after Triton's defaults and normalisation (see
``zinfer.broker.model_config``), so code that reads them never sees an unset field. ``to_dict()`` gives
Triton's JSON form of a record; unset optional blocks (``None``) are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from zinfer.client.dtypes import BYTES, config_to_wire

from .config_base import (
    BatchInputKind,
    BatchOutputKind,
    ControlKind,
    InputFormat,
    InstanceKind,
    ModelPriority,
    SecondaryDeviceKind,
    TimeoutAction,
    empty_map,
    frozen_map,
    json_meta,
    record_to_dict,
)

__all__ = [
    "Accelerator",
    "BatchInput",
    "BatchInputKind",
    "BatchOutput",
    "BatchOutputKind",
    "ControlInput",
    "ControlKind",
    "CudaGraphSpec",
    "CudaOptimization",
    "DynamicBatching",
    "EnsembleScheduling",
    "EnsembleStep",
    "ExecutionAccelerators",
    "GraphLowerBound",
    "InitialState",
    "InputConfig",
    "InputFormat",
    "InstanceGroup",
    "InstanceKind",
    "MetricControl",
    "ModelMetrics",
    "ModelOperations",
    "ModelPriority",
    "ModelWarmup",
    "Optimization",
    "OutputConfig",
    "QueuePolicy",
    "RateLimiter",
    "RateLimiterResource",
    "RepositoryAgent",
    "ResponseCache",
    "SecondaryDevice",
    "SecondaryDeviceKind",
    "SequenceBatching",
    "SequenceControl",
    "SequenceDirect",
    "SequenceOldest",
    "SequenceState",
    "TensorConfig",
    "TimeoutAction",
    "TransactionPolicy",
    "VersionPolicy",
    "WarmupInput",
    "empty_map",
    "frozen_map",
    "json_meta",
    "record_to_dict",
]

# ----------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class TensorConfig:
    """What inputs and outputs share. ``dims`` excludes the batch dimension; ``-1`` is variable."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = field(default=None, metadata=json_meta(wrap="shape"))
    is_shape_tensor: bool = False
    is_non_linear_format_io: bool = False

    @property
    def wire_dtype(self) -> str:
        """The wire name of the data type: ``TYPE_FP32`` -> ``FP32``, ``TYPE_STRING`` -> ``BYTES``."""
        return config_to_wire(self.data_type)

    def full_shape(self, max_batch_size: int) -> tuple[int, ...]:
        """The shape a request carries: ``(-1, *dims)`` when the model batches, else ``dims``."""
        return (-1, *self.dims) if max_batch_size > 0 else self.dims

    @property
    def is_fixed_size(self) -> bool:
        """No variable dimension and not ``BYTES``: every element of the batch has the same byte size."""
        return -1 not in self.dims and self.wire_dtype != BYTES


@dataclass(frozen=True, slots=True)
class InputConfig(TensorConfig):
    format: InputFormat = InputFormat.FORMAT_NONE
    allow_ragged_batch: bool = False
    optional: bool = False


@dataclass(frozen=True, slots=True)
class OutputConfig(TensorConfig):
    label_filename: str = ""


@dataclass(frozen=True, slots=True)
class BatchInput:
    kind: BatchInputKind
    target_name: tuple[str, ...]
    data_type: str
    source_input: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BatchOutput:
    target_name: tuple[str, ...]
    kind: BatchOutputKind
    source_input: tuple[str, ...]


# ----------------------------------------------------------------------------------------- versions


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """``latest { num_versions }`` (the default, with 1), ``all { }`` or ``specific { versions }``."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"all": {}}


# ----------------------------------------------------------------------------------------- schedulers


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """``preferred_batch_size`` is already normalised: ``(max_batch_size,)`` when it was empty.

    ``zinfer_latency_target_microseconds`` is zinfer's own field (not in Triton's proto): when > 0 the
    batcher adapts its waiting to meet that queue+execution latency target (``zinfer.broker.adaptive``).
    """

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=empty_map)
    zinfer_latency_target_microseconds: int = 0  # zinfer's adaptive batching target; 0 = off

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form; the zinfer field only when it is set, so the rest stays Triton's."""
        out = record_to_dict(self)
        if not self.zinfer_latency_target_microseconds:
            del out["zinfer_latency_target_microseconds"]
        return out


@dataclass(frozen=True, slots=True)
class SequenceControl:
    kind: ControlKind
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: str = ""


@dataclass(frozen=True, slots=True)
class ControlInput:
    name: str
    control: tuple[SequenceControl, ...]


@dataclass(frozen=True, slots=True)
class InitialState:
    """Initial data of an implicit state: zeros (``zero_data``) or the file ``data_file``."""

    data_type: str
    dims: tuple[int, ...]
    name: str
    zero_data: bool = False
    data_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims), "name": self.name}
        if self.data_file:
            out["data_file"] = self.data_file
        else:
            out["zero_data"] = self.zero_data
        return out


@dataclass(frozen=True, slots=True)
class SequenceState:
    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]
    initial_state: tuple[InitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False


@dataclass(frozen=True, slots=True)
class SequenceDirect:
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0


@dataclass(frozen=True, slots=True)
class SequenceOldest:
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """Exactly one of ``direct`` and ``oldest`` is set (``direct`` when the config names neither)."""

    direct: SequenceDirect | None = None
    oldest: SequenceOldest | None = None
    max_sequence_idle_microseconds: int = 1_000_000
    control_input: tuple[ControlInput, ...] = ()
    state: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """``model_version`` -1 (also when absent) means the latest version."""

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=empty_map)
    output_map: Mapping[str, str] = field(default_factory=empty_map)
    model_namespace: str = ""


@dataclass(frozen=True, slots=True)
class EnsembleScheduling:
    step: tuple[EnsembleStep, ...] = ()
    max_inflight_requests: int = 0
    max_inflight_responses: int = 0


# ----------------------------------------------------------------------------------------- instances


@dataclass(frozen=True, slots=True)
class RateLimiterResource:
    name: str
    is_global: bool = field(default=False, metadata=json_meta("global"))
    count: int = 0


@dataclass(frozen=True, slots=True)
class RateLimiter:
    resources: tuple[RateLimiterResource, ...] = ()
    priority: int = 1


@dataclass(frozen=True, slots=True)
class SecondaryDevice:
    kind: SecondaryDeviceKind = SecondaryDeviceKind.KIND_NVDLA
    device_id: int = 0


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """``count`` instances per listed GPU (GPU kinds) or in all (CPU); empty ``gpus`` means all GPUs."""

    name: str
    kind: InstanceKind = InstanceKind.KIND_AUTO
    count: int = 1
    gpus: tuple[int, ...] = ()
    rate_limiter: RateLimiter | None = None
    secondary_devices: tuple[SecondaryDevice, ...] = ()
    profile: tuple[str, ...] = ()
    passive: bool = False
    host_policy: str = ""


# ----------------------------------------------------------------------------------------- the rest


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One warmup input: zeros, random data or the file ``input_data_file`` (exactly one)."""

    data_type: str
    dims: tuple[int, ...]
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims)}
        if self.input_data_file:
            out["input_data_file"] = self.input_data_file
        elif self.random_data:
            out["random_data"] = True
        else:
            out["zero_data"] = True
        return out


@dataclass(frozen=True, slots=True)
class ModelWarmup:
    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput] = field(default_factory=empty_map)
    count: int = 0


@dataclass(frozen=True, slots=True)
class Accelerator:
    name: str
    parameters: Mapping[str, str] = field(default_factory=empty_map)


@dataclass(frozen=True, slots=True)
class ExecutionAccelerators:
    gpu_execution_accelerator: tuple[Accelerator, ...] = ()
    cpu_execution_accelerator: tuple[Accelerator, ...] = ()


@dataclass(frozen=True, slots=True)
class GraphLowerBound:
    batch_size: int = 0
    input: Mapping[str, tuple[int, ...]] = field(
        default_factory=empty_map, metadata=json_meta(wrap_values="dim")
    )


@dataclass(frozen=True, slots=True)
class CudaGraphSpec:
    batch_size: int = 0
    input: Mapping[str, tuple[int, ...]] = field(
        default_factory=empty_map, metadata=json_meta(wrap_values="dim")
    )
    graph_lower_bound: GraphLowerBound | None = None


@dataclass(frozen=True, slots=True)
class CudaOptimization:
    graphs: bool = False
    busy_wait_events: bool = False
    graph_spec: tuple[CudaGraphSpec, ...] = ()
    output_copy_stream: bool = False


@dataclass(frozen=True, slots=True)
class Optimization:
    """``graph_level`` is ``graph { level }``; pinned memory is on unless a block turns it off."""

    graph_level: int | None = field(default=None, metadata=json_meta("graph", wrap="level"))
    priority: ModelPriority = ModelPriority.PRIORITY_DEFAULT
    cuda: CudaOptimization | None = None
    execution_accelerators: ExecutionAccelerators | None = None
    input_pinned_memory: bool = field(default=True, metadata=json_meta(wrap="enable"))
    output_pinned_memory: bool = field(default=True, metadata=json_meta(wrap="enable"))
    gather_kernel_buffer_threshold: int = 0
    eager_batching: bool = False


@dataclass(frozen=True, slots=True)
class MetricControl:
    """``metric_identifier { family }`` and ``histogram_options { buckets }``."""

    family: str = field(default="", metadata=json_meta("metric_identifier", wrap="family"))
    buckets: tuple[float, ...] | None = field(
        default=None, metadata=json_meta("histogram_options", wrap="buckets")
    )


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    metric_control: tuple[MetricControl, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelOperations:
    op_library_filename: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RepositoryAgent:
    name: str
    parameters: Mapping[str, str] = field(default_factory=empty_map)


@dataclass(frozen=True, slots=True)
class TransactionPolicy:
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class ResponseCache:
    enable: bool = False
