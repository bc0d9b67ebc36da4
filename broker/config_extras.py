"""Build the remaining config records: instance groups, warmup, optimization, metrics, operations, agents.

The same rules as ``zinfer.broker.config_decode``: one ``decode_*`` per message type, each ending with
``finish()`` so that unknown fields are errors.
"""

from __future__ import annotations

from .config_decode import nonnegative, required_block
from .config_fields import INT32, INT64, UINT32, Block
from .config_records import (
    Accelerator,
    CudaGraphSpec,
    CudaOptimization,
    ExecutionAccelerators,
    GraphLowerBound,
    InstanceGroup,
    InstanceKind,
    MetricControl,
    ModelMetrics,
    ModelOperations,
    ModelPriority,
    ModelWarmup,
    Optimization,
    RateLimiter,
    RateLimiterResource,
    RepositoryAgent,
    SecondaryDevice,
    SecondaryDeviceKind,
    WarmupInput,
    frozen_map,
)

# ----------------------------------------------------------------------------------------- instances


def _decode_resource(b: Block) -> RateLimiterResource:
    record = RateLimiterResource(
        name=b.string("name"), is_global=b.boolean("global"), count=b.integer("count", UINT32)
    )
    if not record.name:
        raise b.error("is required and may not be empty", "name")
    b.finish()
    return record


def _decode_rate_limiter(b: Block) -> RateLimiter:
    record = RateLimiter(
        resources=tuple(_decode_resource(r) for r in b.blocks("resources")),
        priority=b.integer("priority", UINT32) or 1,
    )
    b.finish()
    return record


def _decode_secondary_device(b: Block) -> SecondaryDevice:
    record = SecondaryDevice(
        kind=b.enum("kind", SecondaryDeviceKind, SecondaryDeviceKind.KIND_NVDLA),
        device_id=b.integer("device_id", INT64),
    )
    b.finish()
    return record


def decode_instance_group(b: Block, index: int, model_name: str) -> InstanceGroup:
    """One ``instance_group`` entry; an unnamed group is called ``<model>_<index>``, count defaults to 1."""
    limiter = b.block("rate_limiter")
    record = InstanceGroup(
        name=b.string("name") or f"{model_name}_{index}",
        kind=b.enum("kind", InstanceKind, InstanceKind.KIND_AUTO),
        count=b.integer("count", INT32, default=1),
        gpus=b.integers("gpus", INT32, nonnegative),
        rate_limiter=None if limiter is None else _decode_rate_limiter(limiter),
        secondary_devices=tuple(_decode_secondary_device(d) for d in b.blocks("secondary_devices")),
        profile=b.strings("profile"),
        passive=b.boolean("passive"),
        host_policy=b.string("host_policy"),
    )
    if record.count < 1:
        raise b.error(f"must be >= 1, got {record.count}", "count")
    if record.gpus and record.kind in (InstanceKind.KIND_CPU, InstanceKind.KIND_MODEL):
        raise b.error(f"may not be given for {record.kind.value}", "gpus")
    b.finish()
    return record


# ----------------------------------------------------------------------------------------- warmup


def _warmup_input_value(entry: Block, name: str) -> WarmupInput:
    b = required_block(entry, name)
    source = b.oneof("zero_data", "random_data", "input_data_file")
    if source is None:
        raise b.error("needs one of zero_data, random_data, input_data_file")
    record = WarmupInput(
        data_type=b.data_type(),
        dims=b.integers("dims", INT64, nonnegative),
        zero_data=b.boolean("zero_data"),
        random_data=b.boolean("random_data"),
        input_data_file=b.string("input_data_file"),
    )
    if source == "input_data_file" and not record.input_data_file:
        raise b.error("may not be empty", "input_data_file")
    b.finish()
    return record


def decode_warmup(b: Block, max_batch_size: int) -> ModelWarmup:
    record = ModelWarmup(
        name=b.string("name"),
        batch_size=b.integer("batch_size", UINT32),
        inputs=frozen_map(b.map("inputs", str, _warmup_input_value)),
        count=b.integer("count", UINT32),
    )
    if not record.name:
        raise b.error("is required and may not be empty", "name")
    limit = max(max_batch_size, 1)
    if not 1 <= record.batch_size <= limit:
        raise b.error(f"must be in [1, {limit}] (max_batch_size {max_batch_size})", "batch_size")
    b.finish()
    return record


# ----------------------------------------------------------------------------------------- optimization


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


# ----------------------------------------------------------------------------------------- the rest


def _decode_metric_control(b: Block) -> MetricControl:
    identifier = required_block(b, "metric_identifier")
    family = identifier.string("family")
    if not family:
        raise identifier.error("is required and may not be empty", "family")
    identifier.finish()
    options = b.block("histogram_options")
    buckets: tuple[float, ...] | None = None
    if options is not None:
        buckets = options.reals("buckets")
        if list(buckets) != sorted(buckets):
            raise options.error("must be in ascending order", "buckets")
        options.finish()
    b.finish()
    return MetricControl(family=family, buckets=buckets)


def decode_model_metrics(b: Block) -> ModelMetrics:
    record = ModelMetrics(metric_control=tuple(_decode_metric_control(c) for c in b.blocks("metric_control")))
    b.finish()
    return record


def decode_model_operations(b: Block) -> ModelOperations:
    record = ModelOperations(op_library_filename=b.strings("op_library_filename"))
    b.finish()
    return record


def _decode_agent(b: Block) -> RepositoryAgent:
    record = RepositoryAgent(name=b.string("name"), parameters=frozen_map(b.string_map("parameters")))
    if not record.name:
        raise b.error("is required and may not be empty", "name")
    b.finish()
    return record


def decode_repository_agents(b: Block) -> tuple[RepositoryAgent, ...]:
    agents = tuple(_decode_agent(a) for a in b.blocks("agents"))
    b.finish()
    return agents


__all__ = [
    "decode_instance_group",
    "decode_model_metrics",
    "decode_model_operations",
    "decode_optimization",
    "decode_repository_agents",
    "decode_warmup",
]
