"""A GPU worker's device: CuPy on one GPU, one CUDA stream per instance, page-locked client regions.

Imported only by a worker started with ``--device gpu:N``; nothing else in zinfer imports CuPy.

- Inputs: each request's rows are copied host-to-device straight from the mapped region (or the inline
  frame) into one device buffer per input, so the host never concatenates.
- Outputs: each request's piece is copied device-to-host straight into the request's output slot, all on
  the instance's stream; ``synchronize`` waits for them before the reply is sent.
- Client regions are registered with ``cudaHostRegister`` when first mapped (unregistered before they are
  unmapped), which makes those copies real DMA; a region that cannot be registered is used pageable.
- Data types CuPy has no kernels for (``BYTES`` as object arrays, ``BF16``) stay NumPy arrays on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from zinfer.client.errors import ConfigError
from zinfer.client.shm import Segment

from .model import Array

log = logging.getLogger(__name__)

_DEVICE_KINDS = "biuf"  # bool, signed, unsigned, float: what CuPy computes on
HOST_REGISTER_DEFAULT = 0


def _address(seg: Segment) -> int:
    """The address of a segment's mapping (the temporary view is released at once)."""
    return int(np.frombuffer(seg.buf, dtype=np.uint8, count=1).ctypes.data)


class GpuDevice:
    kind = "GPU"
    is_host = False

    def __init__(self, index: int) -> None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a CUDA library that fails to load
            raise ConfigError(
                f"device gpu:{index}: CuPy cannot be imported ({type(exc).__name__}: {exc}); "
                "install it with: pip install 'zinfer[gpu]'"
            ) from None
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:
            raise ConfigError(f"device gpu:{index}: no usable CUDA device ({exc})") from None
        if not 0 <= index < count:
            raise ConfigError(f"device gpu:{index}: only {count} GPU(s) are visible to this process")
        self.cp: Any = cupy
        self.xp: ModuleType = cupy
        self.id = index
        self.spec = f"gpu:{index}"
        self.device = cupy.cuda.Device(index)
        self.device.use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()  # the instance's own stream: every CuPy call of this worker runs on it
        self._pinned: dict[str, int] = {}
        self._keep: list[Any] = []  # device temporaries read by copies still in flight
        self._pin_failed = False

    def module_of(self, a: Any) -> ModuleType:
        return self.xp if isinstance(a, self.cp.ndarray) else np

    def on_device(self, dtype: np.dtype[Any]) -> bool:
        return dtype.kind in _DEVICE_KINDS

    def upload(self, a: Array) -> Array:
        if not self.on_device(a.dtype):
            return a
        out: Array = self.cp.asarray(a)
        return out

    def batch(self, pieces: Sequence[Array]) -> Array:
        first = pieces[0]
        if not self.on_device(first.dtype):
            return first if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        if len(pieces) == 1:
            out: Any = self.cp.empty(first.shape, first.dtype)
            if first.size:
                out.set(np.ascontiguousarray(first))
            return out  # type: ignore[no-any-return]
        rows = sum(int(p.shape[0]) for p in pieces)
        out = self.cp.empty((rows, *first.shape[1:]), first.dtype)
        start = 0
        for p in pieces:
            n = int(p.shape[0])
            if p.size:
                out[start : start + n].set(np.ascontiguousarray(p))
            start += n
        return out  # type: ignore[no-any-return]

    def as_output(self, value: Any) -> Array:
        if isinstance(value, self.cp.ndarray):
            return value  # type: ignore[no-any-return]
        return np.asarray(value)

    def copy_to_host(self, a: Array, dst: Array) -> None:
        if not isinstance(a, self.cp.ndarray):
            np.copyto(dst, a)
            return
        src = self.cp.ascontiguousarray(a)
        self._keep.append(src)
        src.get(out=dst, blocking=False)

    def to_host(self, a: Array) -> Array:
        if isinstance(a, self.cp.ndarray):
            host: Array = a.get()
            return host
        return np.ascontiguousarray(a)

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._keep.clear()

    def pin(self, seg: Segment) -> None:
        if seg.size == 0 or seg.name in self._pinned:
            return
        ptr = _address(seg)
        try:
            self.cp.cuda.runtime.hostRegister(ptr, seg.size, HOST_REGISTER_DEFAULT)
        except Exception as exc:
            if not self._pin_failed:  # once: every region of this host would fail the same way
                log.warning("event=host_register_failed size=%d error=%r pageable=1", seg.size, exc)
                self._pin_failed = True
            return
        self._pinned[seg.name] = ptr

    def unpin(self, seg: Segment) -> None:
        ptr = self._pinned.pop(seg.name, None)
        if ptr is None:
            return
        try:
            self.stream.synchronize()  # no copy may still be reading or writing the region
            self.cp.cuda.runtime.hostUnregister(ptr)
        except Exception as exc:
            log.warning("event=host_unregister_failed error=%r", exc)

    def close(self) -> None:
        try:
            self.stream.synchronize()
        finally:
            self._keep.clear()
