"""Build the config records from pbtxt blocks, with Triton's defaults and checks.

One ``decode_*`` function per message type. Each reads its fields through a :class:`Block` and ends with
``finish()``, so an unknown field in any block is an error. Checks that need the whole config (names,
the scheduler oneof) live in ``zinfer.broker.model_config``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .config_fields import INT32, INT64, UINT32, UINT64, Block
from .config_records import (
    BatchInput,
    BatchInputKind,
    BatchOutput,
    BatchOutputKind,
    ControlInput,
    ControlKind,
    DynamicBatching,
    EnsembleScheduling,
    EnsembleStep,
    InitialState,
    InputConfig,
    InputFormat,
    OutputConfig,
    QueuePolicy,
    SequenceBatching,
    SequenceControl,
    SequenceDirect,
    SequenceOldest,
    SequenceState,
    TimeoutAction,
    VersionPolicy,
    frozen_map,
)

_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32")


def required_block(b: Block, name: str) -> Block:
    block = b.block(name)
    if block is None:
        raise b.error("is required", name)
    return block


def _required_string(b: Block, name: str) -> str:
    value = b.string(name)
    if not value:
        raise b.error("is required and may not be empty", name)
    return value


def _dim_check(value: int) -> str | None:
    if value >= 1 or value == -1:
        return None
    return f"a dimension must be >= 1, or -1 for a variable size, got {value}"


def nonnegative(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def read_dims(b: Block, name: str = "dims", *, required: bool = True) -> tuple[int, ...]:
    dims = b.integers(name, INT64, _dim_check)
    if required and not dims:
        raise b.error("is required and may not be empty", name)
    return dims


def _segments(shape: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between the variable (-1) ones."""
    runs: list[list[int]] = [[]]
    for dim in shape:
        if dim == -1:
            runs.append([])
        else:
            runs[-1].append(dim)
    return [math.prod(run) for run in runs]


def _reshape(b: Block, dims: tuple[int, ...]) -> tuple[int, ...] | None:
    block = b.block("reshape")
    if block is None:
        return None
    shape = block.integers("shape", INT64, _dim_check)
    block.finish()
    if _segments(shape) != _segments(dims):
        raise b.error(
            f"shape {list(shape)} does not hold the same elements as dims {list(dims)}",
            "reshape",
        )
    return shape


# ----------------------------------------------------------------------------------------- tensors


def decode_input(b: Block) -> InputConfig:
    name = _required_string(b, "name")
    dims = read_dims(b)
    config = InputConfig(
        name=name,
        data_type=b.data_type(),
        dims=dims,
        reshape=_reshape(b, dims),
        is_shape_tensor=b.boolean("is_shape_tensor"),
        is_non_linear_format_io=b.boolean("is_non_linear_format_io"),
        format=b.enum("format", InputFormat, InputFormat.FORMAT_NONE),
        allow_ragged_batch=b.boolean("allow_ragged_batch"),
        optional=b.boolean("optional"),
    )
    b.finish()
    return config


def decode_output(b: Block) -> OutputConfig:
    name = _required_string(b, "name")
    dims = read_dims(b)
    config = OutputConfig(
        name=name,
        data_type=b.data_type(),
        dims=dims,
        reshape=_reshape(b, dims),
        is_shape_tensor=b.boolean("is_shape_tensor"),
        is_non_linear_format_io=b.boolean("is_non_linear_format_io"),
        label_filename=b.string("label_filename"),
    )
    b.finish()
    return config


def decode_batch_input(b: Block) -> BatchInput:
    record = BatchInput(
        kind=b.enum("kind", BatchInputKind, BatchInputKind.BATCH_ELEMENT_COUNT),
        target_name=b.strings("target_name"),
        data_type=b.data_type(),
        source_input=b.strings("source_input"),
    )
    if not record.target_name:
        raise b.error("is required", "target_name")
    if record.data_type not in ("TYPE_INT32", "TYPE_FP32"):
        raise b.error(f"must be TYPE_INT32 or TYPE_FP32, got {record.data_type}", "data_type")
    b.finish()
    return record


def decode_batch_output(b: Block) -> BatchOutput:
    record = BatchOutput(
        target_name=b.strings("target_name"),
        kind=b.enum("kind", BatchOutputKind, BatchOutputKind.BATCH_SCATTER_WITH_INPUT_SHAPE),
        source_input=b.strings("source_input"),
    )
    if not record.target_name:
        raise b.error("is required", "target_name")
    b.finish()
    return record


# ----------------------------------------------------------------------------------------- versions


def decode_version_policy(b: Block) -> VersionPolicy:
    choice = b.oneof("latest", "all", "specific")
    if choice is None:
        policy = VersionPolicy()
    else:
        inner = required_block(b, choice)
        if choice == "latest":
            count = inner.integer("num_versions", UINT32, default=1)
            if count < 1:
                raise inner.error("must be >= 1", "num_versions")
            policy = VersionPolicy("latest", num_versions=count)
        elif choice == "specific":
            versions = inner.integers("versions", INT64, nonnegative)
            if not versions:
                raise inner.error("'specific' needs at least one version", "versions")
            policy = VersionPolicy("specific", num_versions=0, versions=tuple(sorted(set(versions))))
        else:
            policy = VersionPolicy("all", num_versions=0)
        inner.finish()
    b.finish()
    return policy


# ----------------------------------------------------------------------------------------- schedulers


def _preferred(b: Block, max_batch_size: int) -> tuple[int, ...]:
    """``preferred_batch_size``, each in [1, max_batch_size]; empty becomes ``(max_batch_size,)``."""

    def check(size: int) -> str | None:
        if max_batch_size <= 0:
            return "a model with max_batch_size 0 takes no preferred batch size"
        if not 1 <= size <= max_batch_size:
            return f"{size} is not in [1, max_batch_size={max_batch_size}]"
        return None

    sizes = b.integers("preferred_batch_size", INT32, check)
    return sizes if sizes or max_batch_size <= 0 else (max_batch_size,)


def decode_queue_policy(b: Block) -> QueuePolicy:
    policy = QueuePolicy(
        timeout_action=b.enum("timeout_action", TimeoutAction, TimeoutAction.REJECT),
        default_timeout_microseconds=b.integer("default_timeout_microseconds", UINT64),
        allow_timeout_override=b.boolean("allow_timeout_override"),
        max_queue_size=b.integer("max_queue_size", UINT32),
    )
    b.finish()
    return policy


def _queue_policy_value(entry: Block, name: str) -> QueuePolicy:
    return decode_queue_policy(required_block(entry, name))


def decode_dynamic_batching(b: Block, max_batch_size: int) -> DynamicBatching:
    default_block = b.block("default_queue_policy")
    record = DynamicBatching(
        preferred_batch_size=_preferred(b, max_batch_size),
        max_queue_delay_microseconds=b.integer("max_queue_delay_microseconds", UINT64),
        preserve_ordering=b.boolean("preserve_ordering"),
        priority_levels=b.integer("priority_levels", UINT64),
        default_priority_level=b.integer("default_priority_level", UINT64),
        default_queue_policy=None if default_block is None else decode_queue_policy(default_block),
        priority_queue_policy=frozen_map(b.map("priority_queue_policy", int, _queue_policy_value)),
        zinfer_latency_target_microseconds=b.integer("zinfer_latency_target_microseconds", UINT64),
    )
    levels = record.priority_levels
    if levels > 0 and not 1 <= record.default_priority_level <= levels:
        raise b.error(
            f"must be in [1, priority_levels={levels}], got {record.default_priority_level}",
            "default_priority_level",
        )
    if levels == 0 and record.default_priority_level != 0:
        raise b.error("needs priority_levels > 0", "default_priority_level")
    for level in record.priority_queue_policy:
        if not 1 <= level <= levels:
            raise b.error(
                f"priority level {level} is not in [1, priority_levels={levels}]", "priority_queue_policy"
            )
    b.finish()
    return record


def _decode_control(b: Block) -> SequenceControl:
    record = SequenceControl(
        kind=b.enum("kind", ControlKind, ControlKind.CONTROL_SEQUENCE_START),
        int32_false_true=b.integers("int32_false_true", INT32),
        fp32_false_true=b.reals("fp32_false_true"),
        bool_false_true=b.booleans("bool_false_true"),
        data_type=b.data_type(required=False),
    )
    pairs = {
        "int32_false_true": len(record.int32_false_true),
        "fp32_false_true": len(record.fp32_false_true),
        "bool_false_true": len(record.bool_false_true),
    }
    given = [name for name, count in pairs.items() if count]
    if record.kind is ControlKind.CONTROL_SEQUENCE_CORRID:
        if given:
            raise b.error("CONTROL_SEQUENCE_CORRID takes a data_type, not false/true values", given[0])
        if record.data_type not in _CORRID_TYPES:
            raise b.error(f"CONTROL_SEQUENCE_CORRID needs data_type {', '.join(_CORRID_TYPES)}", "data_type")
    else:
        if len(given) != 1:
            raise b.error(f"{record.kind.value} needs exactly one of {', '.join(pairs)}", "kind")
        if pairs[given[0]] != 2:
            raise b.error("takes two values: false, then true", given[0])
    b.finish()
    return record


def _decode_control_input(b: Block) -> ControlInput:
    record = ControlInput(
        name=_required_string(b, "name"), control=tuple(_decode_control(c) for c in b.blocks("control"))
    )
    b.finish()
    return record


def _decode_initial_state(b: Block) -> InitialState:
    source = b.oneof("zero_data", "data_file")
    if source is None:
        raise b.error("needs zero_data or data_file")
    record = InitialState(
        data_type=b.data_type(),
        dims=read_dims(b, required=False),
        name=_required_string(b, "name"),
        zero_data=b.boolean("zero_data"),
        data_file=b.string("data_file"),
    )
    if source == "data_file" and not record.data_file:
        raise b.error("may not be empty", "data_file")
    b.finish()
    return record


def _decode_state(b: Block) -> SequenceState:
    record = SequenceState(
        input_name=_required_string(b, "input_name"),
        output_name=_required_string(b, "output_name"),
        data_type=b.data_type(),
        dims=read_dims(b),
        initial_state=tuple(_decode_initial_state(s) for s in b.blocks("initial_state")),
        use_same_buffer_for_input_output=b.boolean("use_same_buffer_for_input_output"),
        use_growable_memory=b.boolean("use_growable_memory"),
    )
    b.finish()
    return record


def decode_sequence_batching(b: Block, max_batch_size: int) -> SequenceBatching:
    direct: SequenceDirect | None = None
    oldest: SequenceOldest | None = None
    if b.oneof("direct", "oldest") == "oldest":
        inner = required_block(b, "oldest")
        oldest = SequenceOldest(
            max_candidate_sequences=inner.integer("max_candidate_sequences", INT32),
            preferred_batch_size=_preferred(inner, max_batch_size),
            max_queue_delay_microseconds=inner.integer("max_queue_delay_microseconds", UINT64),
            preserve_ordering=inner.boolean("preserve_ordering"),
        )
        if oldest.max_candidate_sequences < 0:
            raise inner.error("must be >= 0", "max_candidate_sequences")
        inner.finish()
    else:
        inner_or_none = b.block("direct")
        direct = SequenceDirect()
        if inner_or_none is not None:
            direct = SequenceDirect(
                max_queue_delay_microseconds=inner_or_none.integer("max_queue_delay_microseconds", UINT64),
                minimum_slot_utilization=inner_or_none.real("minimum_slot_utilization"),
            )
            if not 0.0 <= direct.minimum_slot_utilization <= 1.0:
                raise inner_or_none.error("must be in [0, 1]", "minimum_slot_utilization")
            inner_or_none.finish()
    record = SequenceBatching(
        direct=direct,
        oldest=oldest,
        max_sequence_idle_microseconds=b.integer("max_sequence_idle_microseconds", UINT64) or 1_000_000,
        control_input=tuple(_decode_control_input(c) for c in b.blocks("control_input")),
        state=tuple(_decode_state(s) for s in b.blocks("state")),
        iterative_sequence=b.boolean("iterative_sequence"),
    )
    b.finish()
    return record


def _decode_step(b: Block) -> EnsembleStep:
    record = EnsembleStep(
        model_name=_required_string(b, "model_name"),
        model_version=b.integer("model_version", INT64, default=-1),
        input_map=frozen_map(b.string_map("input_map")),
        output_map=frozen_map(b.string_map("output_map")),
        model_namespace=b.string("model_namespace"),
    )
    if record.model_version < -1:
        raise b.error("must be -1 (latest) or a version >= 0", "model_version")
    b.finish()
    return record


def decode_ensemble_scheduling(b: Block) -> EnsembleScheduling:
    record = EnsembleScheduling(
        step=tuple(_decode_step(s) for s in b.blocks("step")),
        max_inflight_requests=b.integer("max_inflight_requests", UINT32),
        max_inflight_responses=b.integer("max_inflight_responses", UINT32),
    )
    if not record.step:
        raise b.error("an ensemble needs at least one step", "step")
    b.finish()
    return record
