"""A GPU worker's device: CuPy on one GPU, a compute and a copy stream per instance, page-locked regions.

Imported only by a worker started with ``--device gpu:N``; nothing else in zinfer imports CuPy.

- Streams: the model and every output copy run on the instance's compute stream (made CuPy's current
  stream, so a model's own CuPy calls land there too); input copies run on a copy stream of its own. Each
  batch array's copies end in a CUDA event the compute stream waits on, so compute never reads an input
  before it has landed, and the copies never wait for compute.
- Inputs: each request's rows are copied host-to-device straight from the mapped region (or the inline
  frame) into one device buffer per input, so the host never concatenates. The buffers are allocated
  while the copy stream is current, from its arena of CuPy's memory pool, and held until the batch's
  ``synchronize``: at most two sets are alive, the running batch's and the staged next one's (double
  buffering without fixed buffers, so a model may keep an input array as long as it likes).
- Outputs: each request's piece is copied device-to-host straight into the request's output slot on the
  compute stream (after the compute that produced it); ``synchronize`` waits for them before the reply.
- Client regions are registered with ``cudaHostRegister`` when first mapped (unregistered before they are
  unmapped, once both streams are idle), which makes those copies real DMA that can run beside compute;
  a region that cannot be registered is used pageable (its copy still overlaps compute, but the host
  waits for it).
- Data types CuPy has no kernels for (``BYTES`` as object arrays, ``BF16``) stay NumPy arrays on the host.

What overlaps, and when. The batch runner runs one batch to the end: gather (H2D copies), model, wait,
scatter (D2H copies), wait, reply. ``synchronize`` runs the ``on_wait`` hook before each wait, that is
once the batch's compute, and later its copies back, are enqueued. A worker with ``gpu_prefetch`` (see
``zinfer.workers.worker``) uses the hook to read its socket: when the next batch's EXECUTE is there (the
broker sends it early because the instance asked for a second place in its idle list), the worker maps
its inputs and calls :meth:`GpuDevice.stage`, so that batch's H2D copies run on the copy stream while the
current batch computes, and while its outputs are copied back (H2D and D2H use separate copy engines).
When that batch starts, :meth:`take_staged` hands the staged arrays to ``batch``, and its compute only
waits on their events. If the next EXECUTE comes in after the current batch's last wait, nothing is
staged and it copies as usual. Nothing else overlaps: a batch's outputs are back in the host slots
before its reply is sent, and the next batch's compute starts after that.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from zinfer.client.errors import ConfigError
from zinfer.client.shm import Segment

from .device import WaitHook
from .model import Array

log = logging.getLogger(__name__)

_DEVICE_KINDS = "biuf"  # bool, signed, unsigned, float: what CuPy computes on
HOST_REGISTER_DEFAULT = 0

PieceKey = tuple[tuple[int, tuple[int, ...], tuple[int, ...], str], ...]


def _address(seg: Segment) -> int:
    """The address of a segment's mapping (the temporary view is released at once)."""
    return int(np.frombuffer(seg.buf, dtype=np.uint8, count=1).ctypes.data)


def _key(pieces: Sequence[Array]) -> PieceKey:
    """Which host memory a batch array is built from: each piece's address, shape, strides and dtype."""
    return tuple((int(p.ctypes.data), tuple(p.shape), tuple(p.strides), p.dtype.str) for p in pieces)


class _Copied(NamedTuple):
    """A batch array on the device and the event its copies end in.

    No host array is kept: a pageable source has been staged by the driver when ``set`` returns, and a
    registered one is the client's mapping, which ``unpin`` unmaps only after the copy stream is idle
    (a view held here would also stop the region from being closed)."""

    array: Any
    event: Any


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
        self.stream = cupy.cuda.Stream(non_blocking=True)  # compute, and the copies back to the host
        self.stream.use()  # the instance's own stream: every CuPy call of this worker runs on it
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)  # host-to-device copies only
        self.on_wait: WaitHook | None = None  # run by synchronize before it blocks (the worker's look-ahead)
        self.staged_batches = 0  # batches whose inputs were staged ahead
        self.staged_hits = 0  # batch arrays served from a staged copy
        self._staged: tuple[object, dict[PieceKey, list[_Copied]]] = (None, {})
        self._ready: dict[PieceKey, list[_Copied]] = {}  # the staged copies of the batch now running
        self._in_use: list[_Copied] = []  # input copies of the running batch, held until synchronize
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

    def _event(self, stream: Any) -> Any:
        event = self.cp.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def _copy_in(self, pieces: Sequence[Array]) -> _Copied:
        """One device array from the pieces, copied on the copy stream; compute must wait on its event."""
        first = pieces[0]
        rows = sum(int(p.shape[0]) for p in pieces) if len(pieces) > 1 else None
        shape = first.shape if rows is None else (rows, *first.shape[1:])
        with self.copy_stream:  # from the copy stream's arena: a block compute freed is never reused here
            out = self.cp.empty(shape, first.dtype)
        if rows is None:
            if first.size:
                out.set(np.ascontiguousarray(first), stream=self.copy_stream)
        else:
            start = 0
            for p in pieces:
                n = int(p.shape[0])
                if p.size:
                    out[start : start + n].set(np.ascontiguousarray(p), stream=self.copy_stream)
                start += n
        return _Copied(out, self._event(self.copy_stream))

    def batch(self, pieces: Sequence[Array]) -> Array:
        first = pieces[0]
        if not self.on_device(first.dtype):
            return first if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        ready = self._ready.get(_key(pieces)) if self._ready else None
        if ready:
            copied = ready.pop()
            self.staged_hits += 1
        else:
            copied = self._copy_in(pieces)
        self.stream.wait_event(copied.event)  # compute runs once this array's copies have landed
        self._in_use.append(copied)
        return copied.array  # type: ignore[no-any-return]

    def stage(self, tag: object, inputs: Sequence[Sequence[Array]]) -> int:
        """Start copying a coming batch's inputs (each entry: one input's pieces, as ``batch`` will get
        them) on the copy stream, beside whatever the compute stream is running. ``take_staged(tag)``
        makes them usable; staging again drops what was staged before. Returns the bytes being copied."""
        staged: dict[PieceKey, list[_Copied]] = {}
        nbytes = 0
        for pieces in inputs:
            if not pieces or not self.on_device(pieces[0].dtype):
                continue
            copied = self._copy_in(pieces)
            staged.setdefault(_key(pieces), []).append(copied)
            nbytes += int(copied.array.nbytes)
        self._staged = (tag, staged)
        if staged:
            self.staged_batches += 1
        return nbytes

    def take_staged(self, tag: object) -> bool:
        """The batch ``tag`` starts: its staged copies (if those were staged) serve ``batch``; any others
        are dropped, so copies of memory a client has since rewritten are never used."""
        staged_tag, staged = self._staged
        self._staged = (None, {})
        self._ready = staged if staged and staged_tag == tag else {}
        return bool(self._ready)

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
        src.get(stream=self.stream, out=dst, blocking=False)

    def to_host(self, a: Array) -> Array:
        if isinstance(a, self.cp.ndarray):
            host: Array = a.get()
            return host
        return np.ascontiguousarray(a)

    def synchronize(self) -> None:
        """Wait for the compute stream (the batch and its copies back); staged copies keep running."""
        hook = self.on_wait
        if hook is not None:
            done = self._event(self.stream)
            try:
                hook(lambda: bool(done.done))
            except Exception:  # the look-ahead is an optimisation: it never fails the batch
                log.exception("event=look_ahead_failed device=%s", self.spec)
        self.stream.synchronize()
        self._keep.clear()
        self._in_use.clear()

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
            self.copy_stream.synchronize()  # no copy may still be reading or writing the region,
            self.stream.synchronize()  # staged ones included
            self.cp.cuda.runtime.hostUnregister(ptr)
        except Exception as exc:
            log.warning("event=host_unregister_failed error=%r", exc)

    def close(self) -> None:
        try:
            self.copy_stream.synchronize()
            self.stream.synchronize()
        finally:
            self._keep.clear()
            self._in_use.clear()
            self._ready = {}
            self._staged = (None, {})
