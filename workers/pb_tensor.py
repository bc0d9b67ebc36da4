"""``pb_utils.Tensor`` and the data-type helpers of ``triton_python_backend_utils``.

Tensors live on the host, as with Triton's default ``FORCE_CPU_ONLY_INPUT_TENSORS``: ``is_cpu()`` is
always true, and a device array given to ``Tensor`` or ``Tensor.from_dlpack`` is copied to the host. An
input's array is the client's own memory, read-only; ``to_dlpack`` of a read-only array hands out a copy
(DLPack cannot mark a buffer read-only for every consumer, and the client's bytes must not be written).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client import dtypes

from .pb_errors import ArgumentTypeError, TritonModelException

NpArray = npt.NDArray[Any]

# TRITONSERVER_DataType numbers, as Triton's triton_to_numpy_type / numpy_to_triton_type use them
_NUMPY_BY_NUMBER: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}  # fmt: skip
_NUMBER_BY_NUMPY = {np.dtype(t): n for n, t in _NUMPY_BY_NUMBER.items()}


def triton_to_numpy_type(data_type: int) -> Any:
    """Triton's data type number (``TRITONSERVER_TYPE_FP32`` is 11) -> the NumPy type."""
    try:
        return _NUMPY_BY_NUMBER[data_type]
    except KeyError:
        raise TritonModelException(f"triton_to_numpy_type: unknown data type {data_type!r}") from None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A NumPy type -> Triton's data type number (``bytes_`` and ``object_`` are 13, BYTES); None if none."""
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in "SOU":
        return 13
    return _NUMBER_BY_NUMPY.get(dt)


def serialize_byte_tensor(input_tensor: NpArray) -> NpArray | None:
    """A BYTES tensor (object or bytes_ array) as Triton lays it out: each element a 4-byte little-endian
    length then its bytes, in row-major order, as a 1-D uint8 array. None for an empty tensor."""
    if input_tensor.size == 0:
        return None
    if input_tensor.dtype.kind not in "OSU":
        raise TritonModelException("serialize_byte_tensor: the tensor must hold bytes or str (np.object_)")
    return np.frombuffer(dtypes.serialize_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | NpArray) -> NpArray:
    """The inverse of ``serialize_byte_tensor``: a 1-D ``np.object_`` array of ``bytes``."""
    buf = bytes(encoded_tensor)
    out: list[bytes] = []
    offset = 0
    while offset < len(buf):
        if offset + 4 > len(buf):
            raise TritonModelException("deserialize_bytes_tensor: truncated length prefix")
        (n,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        if offset + n > len(buf):
            raise TritonModelException("deserialize_bytes_tensor: an element runs past the end")
        out.append(buf[offset : offset + n])
        offset += n
    arr = np.empty(len(out), dtype=np.object_)
    arr[:] = out
    return arr


class _Capsule:
    """A bare DLPack capsule (``torch.utils.dlpack.to_dlpack``) dressed as an object NumPy can import."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; a device capsule fails in np.from_dlpack and goes to CuPy


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
        cpu = getattr(data, "cpu", None)  # a framework tensor on a device (torch)
        if callable(cpu):
            return np.from_dlpack(cpu())
    if type(data).__name__ == "PyCapsule":
        try:
            return np.from_dlpack(_Capsule(data))
        except (TypeError, RuntimeError, BufferError):
            import cupy

            return np.asarray(cupy.from_dlpack(data).get())
    try:
        return np.asarray(data)
    except Exception as exc:
        raise TritonModelException(f"Tensor {name!r}: cannot use {type(data).__name__} as an array") from exc


class Tensor:
    """A named host tensor: ``Tensor("OUTPUT0", np.array(...))``."""

    def __init__(self, name: str, data: Any, triton_dtype: int | None = None) -> None:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"Tensor name must be a string, got {type(name).__name__}")
        if data is None:
            raise ArgumentTypeError(f"Tensor {name!r}: the data must be an array, got None")
        self._name = name
        array = data if type(data) is np.ndarray else _host_array(data, name)  # the usual: a host array
        if array.dtype.kind == "V":
            raise TritonModelException(
                f"Tensor {name!r}: dtype {array.dtype} is not supported (use np.object_)"
            )
        if triton_dtype is not None and array.dtype != np.dtype(triton_to_numpy_type(triton_dtype)):
            array = array.view(triton_to_numpy_type(triton_dtype))
        self._array: NpArray = array

    @classmethod
    def _of(cls, name: str, array: NpArray) -> Tensor:
        """A tensor of an array the worker made (a request's input): a host array of a supported dtype is
        taken as it is, with no conversion; anything else goes through the checks of ``__init__``."""
        if type(array) is not np.ndarray or array.dtype.kind == "V":
            return cls(name, array)
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> NpArray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (zero-copy; a copy for a read-only input, see the module doc)."""
        array = self._array
        if array.dtype.kind in "OSU":
            raise TritonModelException(f"Tensor {self._name!r}: BYTES tensors cannot be exported to DLPack")
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array).copy()
        return array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (NumPy, CuPy, torch); device
        data is copied to the host."""
        if capsule is None or not name:  # Triton's checks of these, with its exception
            raise TritonModelException(f"Tensor.from_dlpack: a name and a capsule are needed ({name!r})")
        return Tensor(name, capsule)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"
