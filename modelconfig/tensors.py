"""The tensors of a model: ``input``, ``output``, ``batch_input`` and ``batch_output``.

Each record sits beside its decoder. ``dims`` exclude the batch dimension; ``-1`` is a variable size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from zinfer.client.dtypes import BYTES, config_to_wire

from .block import INT64, Block, dim_check, optional_block, read_dims, required_string, required_strings
from .record_base import ProtoEnum, json_meta

__all__ = [
    "BatchInput",
    "BatchInputKind",
    "BatchOutput",
    "BatchOutputKind",
    "InputConfig",
    "InputFormat",
    "OutputConfig",
    "TensorConfig",
    "decode_batch_input",
    "decode_batch_output",
    "decode_input",
    "decode_output",
]


class InputFormat(ProtoEnum):
    FORMAT_NONE = "FORMAT_NONE"
    FORMAT_NHWC = "FORMAT_NHWC"
    FORMAT_NCHW = "FORMAT_NCHW"


class BatchInputKind(ProtoEnum):
    BATCH_ELEMENT_COUNT = "BATCH_ELEMENT_COUNT"
    BATCH_ACCUMULATED_ELEMENT_COUNT = "BATCH_ACCUMULATED_ELEMENT_COUNT"
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"
    BATCH_MAX_ELEMENT_COUNT_AS_SHAPE = "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"
    BATCH_ITEM_SHAPE = "BATCH_ITEM_SHAPE"
    BATCH_ITEM_SHAPE_FLATTEN = "BATCH_ITEM_SHAPE_FLATTEN"


class BatchOutputKind(ProtoEnum):
    BATCH_SCATTER_WITH_INPUT_SHAPE = "BATCH_SCATTER_WITH_INPUT_SHAPE"


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
    shape = optional_block(b, "reshape", lambda x: x.integers("shape", INT64, dim_check), None)
    if shape is not None and _segments(shape) != _segments(dims):
        raise b.error(
            f"shape {list(shape)} does not hold the same elements as dims {list(dims)}",
            "reshape",
        )
    return shape


class _TensorFields(TypedDict):
    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    is_shape_tensor: bool
    is_non_linear_format_io: bool


def _tensor_fields(b: Block) -> _TensorFields:
    """The fields of :class:`TensorConfig`, which inputs and outputs decode alike."""
    name = required_string(b, "name")
    dims = read_dims(b)
    return {
        "name": name,
        "data_type": b.data_type(),
        "dims": dims,
        "reshape": _reshape(b, dims),
        "is_shape_tensor": b.boolean("is_shape_tensor"),
        "is_non_linear_format_io": b.boolean("is_non_linear_format_io"),
    }


def decode_input(b: Block) -> InputConfig:
    config = InputConfig(
        **_tensor_fields(b),
        format=b.enum("format", InputFormat, InputFormat.FORMAT_NONE),
        allow_ragged_batch=b.boolean("allow_ragged_batch"),
        optional=b.boolean("optional"),
    )
    if config.format is not InputFormat.FORMAT_NONE and len(config.dims) != 3:
        # Triton's rule (ValidateModelInput): an image layout names three dims, batch left out
        raise b.error(f"{config.format.value} requires 3 dims, got {list(config.dims)}", "format")
    b.finish()
    return config


def decode_output(b: Block) -> OutputConfig:
    config = OutputConfig(
        **_tensor_fields(b),
        label_filename=b.string("label_filename"),
    )
    b.finish()
    return config


def decode_batch_input(b: Block) -> BatchInput:
    record = BatchInput(
        kind=b.enum("kind", BatchInputKind, BatchInputKind.BATCH_ELEMENT_COUNT),
        target_name=required_strings(b, "target_name"),
        data_type=b.data_type(),
        source_input=b.strings("source_input"),
    )
    if record.data_type not in ("TYPE_INT32", "TYPE_FP32"):
        raise b.error(f"must be TYPE_INT32 or TYPE_FP32, got {record.data_type}", "data_type")
    b.finish()
    return record


def decode_batch_output(b: Block) -> BatchOutput:
    record = BatchOutput(
        target_name=required_strings(b, "target_name"),
        kind=b.enum("kind", BatchOutputKind, BatchOutputKind.BATCH_SCATTER_WITH_INPUT_SHAPE),
        source_input=b.strings("source_input"),
    )
    b.finish()
    return record
