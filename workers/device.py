"""Where a worker's model runs: the host (NumPy) or one GPU (CuPy), behind one small interface.

``open_device("cpu")`` gives :class:`CpuDevice`; ``open_device("gpu:N")`` imports CuPy (only then) and
gives ``zinfer.workers.gpu.GpuDevice`` bound to device N with one CUDA stream of its own. The batch
runner moves tensors through the device: ``batch`` builds a batch array from the requests' host arrays
(a concatenation on the host, H2D copies into one device buffer on a GPU), ``copy_to_host`` writes an
output piece into a request's slot and ``synchronize`` waits for those copies before the reply goes.
``pin``/``unpin`` page-lock a client region while it is mapped, so its copies are real DMA.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from zinfer.client.errors import ConfigError
from zinfer.client.shm import Segment

from .model import Array


class Device(Protocol):
    spec: str  # "cpu" or "gpu:<id>"
    kind: str  # "CPU" or "GPU" (Triton's model_instance_kind)
    id: int  # the GPU's index; 0 for the CPU
    is_host: bool  # arrays are NumPy arrays in host memory
    xp: ModuleType  # numpy or cupy

    def module_of(self, a: Any) -> ModuleType:
        """``cupy`` for a device array, ``numpy`` otherwise."""
        ...

    def upload(self, a: Array) -> Array:
        """A host array on this device (weights at load time)."""
        ...

    def batch(self, pieces: Sequence[Array]) -> Array:
        """One batch array from the requests' host arrays, along axis 0 (a lone piece may be kept)."""
        ...

    def as_output(self, value: Any) -> Array:
        """A model's output value as an array: device arrays as they are, anything else through NumPy."""
        ...

    def copy_to_host(self, a: Array, dst: Array) -> None:
        """Write ``a`` into the host array ``dst`` (same shape and dtype); done by ``synchronize``."""
        ...

    def to_host(self, a: Array) -> Array:
        """``a`` as a C-contiguous host array."""
        ...

    def synchronize(self) -> None: ...

    def pin(self, seg: Segment) -> None: ...

    def unpin(self, seg: Segment) -> None: ...

    def close(self) -> None: ...


class CpuDevice:
    spec = "cpu"
    kind = "CPU"
    id = 0
    is_host = True
    xp: ModuleType = np

    def module_of(self, a: Any) -> ModuleType:
        return np

    def upload(self, a: Array) -> Array:
        return a

    def batch(self, pieces: Sequence[Array]) -> Array:
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)

    def as_output(self, value: Any) -> Array:
        return np.asarray(value)

    def copy_to_host(self, a: Array, dst: Array) -> None:
        if a.ctypes.data != dst.ctypes.data or a.strides != dst.strides:  # else the model wrote it there
            np.copyto(dst, a)

    def to_host(self, a: Array) -> Array:
        return np.ascontiguousarray(a)

    def synchronize(self) -> None:
        pass

    def pin(self, seg: Segment) -> None:
        pass

    def unpin(self, seg: Segment) -> None:
        pass

    def close(self) -> None:
        pass


CPU = CpuDevice()


def parse_device(spec: str) -> int | None:
    """The GPU index of ``gpu:<N>``, None for ``cpu``; anything else is a :class:`ConfigError`."""
    if spec == "cpu":
        return None
    kind, _, index = spec.partition(":")
    if kind == "gpu" and index.isascii() and index.isdigit():
        return int(index)
    raise ConfigError(f"device {spec!r}: expected 'cpu' or 'gpu:<index>'")


def open_device(spec: str) -> Device:
    """The device a worker was started for (``--device``); a GPU that cannot be used is a ConfigError."""
    gpu = parse_device(spec)
    if gpu is None:
        return CPU
    from .gpu import GpuDevice

    return GpuDevice(gpu)
