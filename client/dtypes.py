"""Tensor data types: Triton config names, wire names and NumPy dtypes.

The wire uses the KServe v2 names (``FP32``, ``INT64``, ``BYTES``, ...); configs use Triton's ``TYPE_*``
names. ``BYTES`` tensors travel in Triton's layout: each element a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgument

try:  # bfloat16 is not a NumPy dtype; ml_dtypes provides it
    import ml_dtypes

    _BF16: np.dtype[np.generic] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _BF16 = None

BYTES = "BYTES"

_NUMPY_BY_WIRE: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
if _BF16 is not None:
    _NUMPY_BY_WIRE["BF16"] = _BF16

_WIRE_BY_NUMPY: dict[np.dtype[np.generic], str] = {dt: name for name, dt in _NUMPY_BY_WIRE.items()}

WIRE_TYPES: frozenset[str] = frozenset([*_NUMPY_BY_WIRE, BYTES])
"""Every data type name accepted on the wire (the allow-list)."""

CONFIG_TYPES: frozenset[str] = frozenset(
    [f"TYPE_{name}" for name in WIRE_TYPES if name != BYTES] + ["TYPE_STRING"]
)


def config_to_wire(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    if config_type == "TYPE_STRING":
        return BYTES
    if config_type not in CONFIG_TYPES:
        raise InvalidArgument(f"unknown data type {config_type!r}")
    return config_type[len("TYPE_") :]


def wire_to_numpy(wire: str) -> np.dtype[np.generic]:
    """The NumPy dtype for a wire type; ``BYTES`` maps to ``object``."""
    if wire == BYTES:
        return np.dtype(object)
    try:
        return _NUMPY_BY_WIRE[wire]
    except KeyError:
        raise InvalidArgument(f"unknown data type {wire!r}") from None


def numpy_to_wire(dtype: npt.DTypeLike) -> str:
    """The wire type of a NumPy dtype; ``object``, ``bytes_`` and ``str_`` arrays are ``BYTES``."""
    try:  # an array's dtype (the usual case) is a key as it is: no conversion
        found = _WIRE_BY_NUMPY.get(dtype)  # type: ignore[arg-type]
    except TypeError:  # unhashable (a structured dtype's field list)
        found = None
    if found is not None:
        return found
    dt = np.dtype(dtype)
    name = _WIRE_BY_NUMPY.get(dt)
    if name is not None:
        return name
    if dt.kind in ("O", "S", "U"):
        return BYTES
    raise InvalidArgument(f"data type {dt} has no zinfer equivalent")


def itemsize(wire: str) -> int:
    """Bytes per element; 0 for ``BYTES`` (variable)."""
    return 0 if wire == BYTES else wire_to_numpy(wire).itemsize


_U32 = struct.Struct("<I")  # an element's length prefix; a Struct made once, not looked up per call


def serialize_bytes(array: npt.NDArray[np.generic]) -> bytes:
    """Encode a ``BYTES`` tensor (object, bytes_ or str_ array) in row-major order."""
    flat = array.reshape(-1)
    if flat.size == 1:  # the usual (one text a request): no list and no join
        item = flat[0]
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        return _U32.pack(len(data)) + data
    pack = _U32.pack
    parts: list[bytes] = []
    for item in flat:
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)  # type: ignore[call-overload]
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, shape: Iterable[int]) -> npt.NDArray[np.object_]:
    """Decode a ``BYTES`` tensor; the element count must match ``shape`` and the buffer must be used up."""
    dims = tuple(shape)
    count = math.prod(dims)  # Python ints: exact, and far cheaper than numpy's for a short tuple
    view = memoryview(buffer).cast("B")
    end = len(view)
    if count == 1 and end >= 4 and _U32.unpack_from(view, 0)[0] == end - 4:
        # one element filling the buffer exactly (the usual); anything else takes the checks below
        one = np.empty(1, dtype=object)
        one[0] = bytes(view[4:])
        return one.reshape(dims)
    items: list[bytes] = []
    pos = 0
    unpack = _U32.unpack_from
    for _ in range(count):
        if pos + 4 > end:
            raise InvalidArgument("BYTES tensor is shorter than its shape says")
        (length,) = unpack(view, pos)
        pos += 4
        if length > end - pos:
            raise InvalidArgument("BYTES tensor element runs past the end of its data")
        items.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != end:
        raise InvalidArgument("BYTES tensor has bytes left over after its last element")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(dims)
