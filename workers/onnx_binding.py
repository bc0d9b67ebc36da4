"""ONNX Runtime I/O binding for KIND_GPU instances: the session reads the worker's device buffers and
leaves its outputs on the device, with no copy through the host.

A GPU worker's batch arrays are CuPy arrays on the instance's device (``zinfer.workers.gpu``: each
request's rows copied host-to-device once, into one buffer per input). :class:`BoundRun` binds each one
to the session by address (``IOBinding.bind_input`` with its device, dtype, shape and pointer), binds
every output to that device (ONNX Runtime allocates it there), runs ``run_with_iobinding`` and hands the
outputs back as CuPy arrays that view ONNX Runtime's own buffers (the ``OrtValue`` is kept alive by the
array), so the batch runner copies each request's piece device-to-host straight into its reply slot.

Ordering: the CUDA execution provider is given the instance's compute stream as its
``user_compute_stream`` (``_providers`` in ``zinfer.workers.onnx_model``), so its kernels run on the stream
that already waits for the batch's input copies, and the output copies back, issued on that same stream
afterwards, run after them. Nothing waits on the host in between.

What stays on the host: outputs whose data type has no device kernels in zinfer (``TYPE_STRING``, which
ONNX Runtime keeps in host memory anyway, and BF16) are bound to host memory; an input that is not a device
array (a BF16 batch, which the worker keeps on the host) is bound as a host tensor, and ONNX Runtime moves
it where its kernels want it. String *inputs* cannot be bound at all (ONNX Runtime 1.x refuses them), so a
model with any runs through ``session.run`` instead (``zinfer.workers.onnx_model``).

The device a binding names is a :class:`Place`: ``("cuda", ordinal)`` on a GPU worker, where ``ordinal``
is the CUDA device number inside the worker's process (0 when the supervisor narrowed
``CUDA_VISIBLE_DEVICES`` to its GPU), not the server's GPU index. ``Place("cpu", 0, ...)`` binds host
arrays by address the same way; the unit tests run the binding logic through it on machines without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import Array

# ONNX Runtime's tensor type names -> NumPy dtypes (what an OrtValue on a device holds)
ORT_NUMPY: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
}

# config data types whose outputs are bound to the device; the rest (TYPE_STRING, TYPE_BF16) to the host
DEVICE_TYPES = frozenset(
    {
        "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64",
        "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_BOOL",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Place:
    """Where bound tensors live: ONNX Runtime's device name and number, how to tell and address a
    device array, and how to view an output ``OrtValue`` there as an array."""

    ort_device: str  # "cuda" or "cpu"
    ordinal: int
    is_device_array: Callable[[Any], bool]
    contiguous: Callable[[Any], Any]  # a C-contiguous array with the same values (the array if it is)
    address: Callable[[Any], int]
    view: Callable[[Any], Array]  # OrtValue on this device -> array that keeps it alive


def host_place() -> Place:
    """Host arrays bound by address (the binding logic without a GPU)."""
    return Place(
        ort_device="cpu",
        ordinal=0,
        is_device_array=lambda a: isinstance(a, np.ndarray) and a.dtype != object,
        contiguous=np.ascontiguousarray,
        address=lambda a: int(a.ctypes.data),
        view=lambda value: value.numpy(),
    )


def cupy_place(cp: Any, ordinal: int) -> Place:
    """CuPy arrays on CUDA device ``ordinal``; outputs viewed in place (no copy, no host round trip)."""

    def view(value: Any) -> Array:
        dtype = ORT_NUMPY[value.data_type()]
        shape = tuple(int(d) for d in value.shape())
        nbytes = math.prod(shape) * dtype.itemsize
        memory = cp.cuda.UnownedMemory(int(value.data_ptr()), nbytes, value, ordinal)  # holds the OrtValue
        out: Array = cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(memory, 0))
        return out

    return Place(
        ort_device="cuda",
        ordinal=ordinal,
        is_device_array=lambda a: isinstance(a, cp.ndarray),
        contiguous=cp.ascontiguousarray,
        address=lambda a: int(a.data.ptr),
        view=view,
    )


class BoundRun:
    """One session's runs through an ``IOBinding``: device inputs by address, outputs left on the device."""

    def __init__(
        self,
        session: Any,
        outputs: Sequence[str],
        device_outputs: frozenset[str],
        place: Place,
        run_options: Any = None,
    ) -> None:
        self.session = session
        self.outputs = list(outputs)
        self.device_outputs = device_outputs
        self.place = place
        self.run_options = run_options

    def run(self, feed: Mapping[str, Any]) -> dict[str, Array]:
        place = self.place
        binding = self.session.io_binding()
        held: list[Any] = []  # the bound inputs, alive until the run has read them
        for name, array in feed.items():
            if place.is_device_array(array):
                bound = place.contiguous(array)
                held.append(bound)
                binding.bind_input(
                    name,
                    place.ort_device,
                    place.ordinal,
                    bound.dtype,
                    tuple(bound.shape),
                    place.address(bound),
                )
            else:
                host = np.ascontiguousarray(array)
                held.append(host)
                binding.bind_cpu_input(name, host)
        for name in self.outputs:
            if name in self.device_outputs:
                binding.bind_output(name, place.ort_device, place.ordinal)
            else:
                binding.bind_output(name)  # host memory
        self.session.run_with_iobinding(binding, self.run_options)
        values = binding.get_outputs()
        result: dict[str, Array] = {}
        for name, value in zip(self.outputs, values, strict=True):
            result[name] = place.view(value) if name in self.device_outputs else value.numpy()
        return result
