"""The inputs and outputs of an ONNX model file, read without ONNX or ONNX Runtime.

The broker auto-completes an ONNX model's config from its graph (``zinfer.modelconfig.autocomplete``)
without loading the model: this module walks the protobuf wire format of ``ModelProto`` over a memory map
and decodes only ``graph.input``, ``graph.output`` and the names of ``graph.initializer`` (graphs of IR
version < 4 list initializers among their inputs; those are not model inputs). Weights are skipped by
their length, never read into memory. A file that is not a well-formed ONNX model is a
:class:`ConfigError` naming it.

Field numbers are those of ``onnx.proto`` (ModelProto.graph = 7; GraphProto initializer = 5, input = 11,
output = 12, sparse_initializer = 15; ValueInfoProto name = 1, type = 2; TypeProto tensor_type = 1;
Tensor elem_type = 1, shape = 2; TensorShapeProto dim = 1; Dimension dim_value = 1, dim_param = 2).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

from zinfer.client.errors import ConfigError

__all__ = ["ONNX_TO_CONFIG", "GraphTensor", "OnnxGraph", "read_onnx_graph"]

# TensorProto.DataType -> Triton's config data type
ONNX_TO_CONFIG: dict[int, str] = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class GraphTensor:
    """One graph input or output. ``dims`` is None when the graph gives no shape; a dim is None when it
    is symbolic or unknown (a variable size). ``data_type`` is Triton's name, or ``""`` for a type Triton
    has none for (``onnx_type`` keeps the number)."""

    name: str
    onnx_type: int
    dims: tuple[int | None, ...] | None

    @property
    def data_type(self) -> str:
        return ONNX_TO_CONFIG.get(self.onnx_type, "")


@dataclass(frozen=True, slots=True)
class OnnxGraph:
    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]


class _Malformed(Exception):
    pass


def _varint(buf: mmap.mmap | bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: mmap.mmap | bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field, wire_type, value_or_start, value_end)`` for each field of the message in [start, end)."""
    out: list[tuple[int, int, int, int]] = []
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos, end)
            out.append((number, wire, value, pos))
        elif wire == _LEN:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise _Malformed(f"field {number} runs past its message")
            out.append((number, wire, pos, pos + length))
            pos += length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise _Malformed("truncated fixed-size field")
        else:
            raise _Malformed(f"unsupported wire type {wire}")
    return out


def _string(buf: mmap.mmap | bytes, start: int, end: int) -> str:
    try:
        return bytes(buf[start:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed("a name is not valid UTF-8") from None


def _shape(buf: mmap.mmap | bytes, start: int, end: int) -> tuple[int | None, ...]:
    dims: list[int | None] = []
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == _LEN:
            value: int | None = None
            for dnum, dwire, da, _ in _fields(buf, a, b):
                if dnum == 1 and dwire == _VARINT:
                    value = da - (1 << 64) if da >= 1 << 63 else da
            dims.append(value if value is not None and value >= 0 else None)
    return tuple(dims)


def _value_info(buf: mmap.mmap | bytes, start: int, end: int) -> GraphTensor:
    name = ""
    onnx_type = 0
    dims: tuple[int | None, ...] | None = None
    for number, wire, a, b in _fields(buf, start, end):
        if number == 1 and wire == _LEN:
            name = _string(buf, a, b)
        elif number == 2 and wire == _LEN:
            for tnum, twire, ta, tb in _fields(buf, a, b):
                if tnum != 1 or twire != _LEN:
                    continue  # sequence, map, optional, sparse: onnx_type stays 0
                for fnum, fwire, fa, fb in _fields(buf, ta, tb):
                    if fnum == 1 and fwire == _VARINT:
                        onnx_type = fa
                    elif fnum == 2 and fwire == _LEN:
                        dims = _shape(buf, fa, fb)
    return GraphTensor(name, onnx_type, dims)


def _tensor_name(buf: mmap.mmap | bytes, start: int, end: int, field: int) -> str:
    return next(
        (_string(buf, a, b) for n, w, a, b in _fields(buf, start, end) if n == field and w == _LEN), ""
    )


def _graph(buf: mmap.mmap | bytes, start: int, end: int) -> OnnxGraph:
    inputs: list[GraphTensor] = []
    outputs: list[GraphTensor] = []
    initializers: set[str] = set()
    for number, wire, a, b in _fields(buf, start, end):
        if wire != _LEN:
            continue
        if number == 11:
            inputs.append(_value_info(buf, a, b))
        elif number == 12:
            outputs.append(_value_info(buf, a, b))
        elif number == 5:
            initializers.add(_tensor_name(buf, a, b, 8))
        elif number == 15:  # SparseTensorProto: its name is that of its values (field 1)
            values = next(((x, y) for n, w, x, y in _fields(buf, a, b) if n == 1 and w == _LEN), None)
            if values is not None:
                initializers.add(_tensor_name(buf, values[0], values[1], 8))
    return OnnxGraph(tuple(t for t in inputs if t.name not in initializers), tuple(outputs))


def parse_onnx_graph(data: mmap.mmap | bytes, source: str) -> OnnxGraph:
    try:
        graph = next(((a, b) for n, w, a, b in _fields(data, 0, len(data)) if n == 7 and w == _LEN), None)
        if graph is None:
            raise _Malformed("no graph")
        return _graph(data, *graph)
    except _Malformed as exc:
        raise ConfigError(f"{source}: not a valid ONNX model ({exc})") from None


def read_onnx_graph(path: Path) -> OnnxGraph:
    """The graph inputs (initializers excluded) and outputs of the ONNX model file at ``path``."""
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size == 0:
                raise ConfigError(f"{path}: not a valid ONNX model (empty file)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return parse_onnx_graph(data, str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
