"""``optimization``: graph level, priority, CUDA graphs, execution accelerators, pinned memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .block import INT32, INT64, UINT32, Block, required_block
from .record_base import ProtoEnum, empty_map, frozen_map, json_meta

__all__ = [
    "Accelerator",
    "CudaGraphSpec",
    "CudaOptimization",
    "ExecutionAccelerators",
    "GraphLowerBound",
    "ModelPriority",
    "Optimization",
    "decode_optimization",
]


class ModelPriority(ProtoEnum):
    PRIORITY_DEFAULT = "PRIORITY_DEFAULT"
    PRIORITY_MAX = "PRIORITY_MAX"
    PRIORITY_MIN = "PRIORITY_MIN"


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


def _shape_value(entry: Block, name: str) -> tuple[int, ...]:
    b = required_block(entry, name)
    dims = b.integers("dim", INT64)
    b.finish()
    return dims


def _decode_lower_bound(b: Block) -> GraphLowerBound:
    record = GraphLowerBound(
        batch_size=b.integer("batch_size", INT32),
        input=frozen_map(b.map("input", str, _shape_value, ())),
    )
    b.finish()
    return record


def _decode_graph_spec(b: Block) -> CudaGraphSpec:
    lower = b.block("graph_lower_bound")
    record = CudaGraphSpec(
        batch_size=b.integer("batch_size", INT32),
        input=frozen_map(b.map("input", str, _shape_value, ())),
        graph_lower_bound=None if lower is None else _decode_lower_bound(lower),
    )
    b.finish()
    return record


def _decode_cuda(b: Block) -> CudaOptimization:
    record = CudaOptimization(
        graphs=b.boolean("graphs"),
        busy_wait_events=b.boolean("busy_wait_events"),
        graph_spec=tuple(_decode_graph_spec(s) for s in b.blocks("graph_spec")),
        output_copy_stream=b.boolean("output_copy_stream"),
    )
    b.finish()
    return record


def _decode_accelerator(b: Block) -> Accelerator:
    record = Accelerator(name=b.string("name"), parameters=frozen_map(b.string_map("parameters")))
    if not record.name:
        raise b.error("is required and may not be empty", "name")
    b.finish()
    return record


def _decode_accelerators(b: Block) -> ExecutionAccelerators:
    record = ExecutionAccelerators(
        gpu_execution_accelerator=tuple(
            _decode_accelerator(a) for a in b.blocks("gpu_execution_accelerator")
        ),
        cpu_execution_accelerator=tuple(
            _decode_accelerator(a) for a in b.blocks("cpu_execution_accelerator")
        ),
    )
    b.finish()
    return record


def _pinned(b: Block, name: str) -> bool:
    """A ``PinnedMemoryBuffer``: on when the block is absent, else its ``enable`` (default false)."""
    block = b.block(name)
    if block is None:
        return True
    enable = block.boolean("enable")
    block.finish()
    return enable


def decode_optimization(b: Block) -> Optimization:
    graph = b.block("graph")
    level: int | None = None
    if graph is not None:
        level = graph.integer("level", INT32)
        graph.finish()
    cuda = b.block("cuda")
    accelerators = b.block("execution_accelerators")
    record = Optimization(
        graph_level=level,
        priority=b.enum("priority", ModelPriority, ModelPriority.PRIORITY_DEFAULT),
        cuda=None if cuda is None else _decode_cuda(cuda),
        execution_accelerators=None if accelerators is None else _decode_accelerators(accelerators),
        input_pinned_memory=_pinned(b, "input_pinned_memory"),
        output_pinned_memory=_pinned(b, "output_pinned_memory"),
        gather_kernel_buffer_threshold=b.integer("gather_kernel_buffer_threshold", UINT32),
        eager_batching=b.boolean("eager_batching"),
    )
    b.finish()
    return record
