"""tritonclient-shaped request helpers, so code written for Triton's Python client ports to zinfer.

::

    from zinfer.client import Client, InferInput, InferRequestedOutput

    inp = InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("model", [inp], outputs=[InferRequestedOutput("OUTPUT0")])
    y = result.as_numpy("OUTPUT0")

``InferInput`` checks the array against its declared shape and data type as tritonclient does, and both
clients' ``infer`` take a list of them where they take a ``{name: array}`` dict. Every error zinfer raises
derives from ``InferenceServerException`` (another name for ``ZinferError``), so ``except
InferenceServerException`` keeps working.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from . import dtypes
from .errors import ClientError, InvalidArgument, ZinferError

__all__ = [
    "InferInput",
    "InferRequestedOutput",
    "InferenceServerException",
    "np_to_triton_dtype",
    "triton_to_np_dtype",
]

InferenceServerException = ZinferError


def np_to_triton_dtype(dtype: npt.DTypeLike) -> str | None:
    """``np.float32`` -> ``"FP32"``; object, bytes and str arrays -> ``"BYTES"``; None if there is none."""
    try:
        return dtypes.numpy_to_wire(dtype)
    except (InvalidArgument, TypeError):
        return None


def triton_to_np_dtype(datatype: str) -> type[Any] | None:
    """``"FP32"`` -> ``np.float32``; ``"BYTES"`` -> ``np.object_``; None for an unknown name."""
    try:
        dt: type[Any] = dtypes.wire_to_numpy(datatype).type
    except InvalidArgument:
        return None
    return dt


class InferInput:
    """One input of a request: a name, a shape and a data type (``"FP32"``, ``"INT64"``, ``"BYTES"``, …),
    then its data from ``set_data_from_numpy``. The shape includes the batch dimension."""

    def __init__(self, name: str, shape: Iterable[int], datatype: str) -> None:
        self._name = name
        self._shape = [int(d) for d in shape]
        self._datatype = datatype
        self._data: npt.NDArray[Any] | None = None

    def name(self) -> str:
        return self._name

    def datatype(self) -> str:
        return self._datatype

    def shape(self) -> list[int]:
        return list(self._shape)

    def set_shape(self, shape: Iterable[int]) -> InferInput:
        """Change the declared shape (the data, if set already, must then be set again to match)."""
        self._shape = [int(d) for d in shape]
        return self

    def set_data_from_numpy(self, input_tensor: npt.NDArray[Any], binary_data: bool = True) -> InferInput:
        """Attach ``input_tensor``; its data type and shape must be the ones declared.

        ``binary_data`` is accepted for compatibility: tensors always travel as raw bytes (or in shared
        memory). An array made by ``client.empty()`` keeps its zero-copy path.
        """
        if not isinstance(input_tensor, np.ndarray):
            raise ClientError("input_tensor must be a numpy array")
        found = np_to_triton_dtype(input_tensor.dtype)
        if found != self._datatype:
            raise ClientError(
                f"got unexpected datatype {found or input_tensor.dtype} from numpy array, "
                f"expected {self._datatype}"
            )
        if list(input_tensor.shape) != self._shape:
            got = ",".join(str(d) for d in input_tensor.shape)
            want = ",".join(str(d) for d in self._shape)
            raise ClientError(f"got unexpected numpy array shape [{got}], expected [{want}]")
        self._data = input_tensor
        return self

    def set_shared_memory(self, region_name: str, byte_size: int, offset: int = 0) -> InferInput:
        raise ClientError(
            "zinfer manages shared memory itself: make the array with client.empty() and pass it to "
            "set_data_from_numpy (it is sent without a copy)"
        )

    def data(self) -> npt.NDArray[Any] | None:
        """The array set by ``set_data_from_numpy`` (not in tritonclient)."""
        return self._data

    def __repr__(self) -> str:
        return f"InferInput({self._name!r}, {self._shape}, {self._datatype!r})"


class InferRequestedOutput:
    """An output to return. ``class_count`` (Triton's classification extension) is not supported."""

    def __init__(self, name: str, class_count: int = 0, binary_data: bool = True) -> None:
        if class_count:
            raise ClientError("classification outputs (class_count) are not supported by zinfer")
        self._name = name

    def name(self) -> str:
        return self._name

    def set_shared_memory(self, region_name: str, byte_size: int, offset: int = 0) -> InferRequestedOutput:
        raise ClientError("zinfer reserves output shared memory itself: results come back as views into it")

    def unset_shared_memory(self) -> InferRequestedOutput:
        return self

    def __repr__(self) -> str:
        return f"InferRequestedOutput({self._name!r})"


InputsArg = Mapping[str, npt.ArrayLike] | Sequence[InferInput]
"""What ``infer`` takes as inputs: ``{name: array}`` or a list of ``InferInput``."""

OutputsArg = Sequence[str | InferRequestedOutput] | None
"""What ``infer`` takes as outputs: names, ``InferRequestedOutput``s, or None for all of them."""


def input_arrays(inputs: InputsArg) -> Mapping[str, npt.ArrayLike]:
    """The ``{name: array}`` form of either input form, in order."""
    if type(inputs) is dict or isinstance(inputs, Mapping):  # a dict is the usual case: no ABC check
        return inputs
    named: dict[str, npt.ArrayLike] = {}
    for item in inputs:
        if not isinstance(item, InferInput):
            raise ClientError(
                f"inputs must be a {{name: array}} mapping or a list of InferInput, not {type(item).__name__}"
            )
        data = item.data()
        if data is None:
            raise ClientError(f"input {item.name()!r} has no data: call set_data_from_numpy first")
        if item.name() in named:
            raise ClientError(f"input {item.name()!r} is given twice")
        named[item.name()] = data
    return named


def output_names(outputs: OutputsArg) -> list[str] | None:
    """The names of either output form; None means every output."""
    if outputs is None:
        return None
    if isinstance(outputs, str):
        raise ClientError("outputs must be a list of names, not one string")
    names: list[str] = []
    for item in outputs:
        if isinstance(item, InferRequestedOutput):
            names.append(item.name())
        elif isinstance(item, str):
            names.append(item)
        else:
            raise ClientError(f"outputs must be names or InferRequestedOutput, not {type(item).__name__}")
    return names


def model_version(version: int | str) -> int:
    """Triton's version strings (``""`` = the server's choice, ``"2"``) as zinfer's ints (0, 2)."""
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    if isinstance(version, str) and (version == "" or version.isdigit()):
        return int(version or 0)
    raise ClientError(f"model_version must be an int or a string of digits, not {version!r}")
