"""A GPU worker's device: CuPy on one GPU, a compute and a copy stream per instance, page-locked regions.

Imported only by a worker started with ``--device gpu:N``; nothing else in zinfer imports CuPy. How the
streams, events, page-locked regions and CuPy's memory pool work together, and what overlaps with what
(the ``on_wait`` hook, ``stage`` and ``take_staged``), is in docs/gpu-worker.md: each part of this file
relies on the order the others keep. A model must not keep an input array past its ``execute``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from zinfer.client.errors import ConfigError, InternalError
from zinfer.client.shm import Segment

from .device_wait import WaitHook
from .model import Array

log = logging.getLogger(__name__)

_DEVICE_KINDS = "biuf"  # bool, signed, unsigned, float: what CuPy computes on
HOST_REGISTER_DEFAULT = 0
DEVICE_ENV = "ZINFER_DEVICE"  # set by the supervisor, with CUDA_VISIBLE_DEVICES narrowed to that GPU
_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged
INSTALL_HINT = (
    "install CuPy for the CUDA major of the driver (nvidia-smi): pip install 'zinfer[gpu-cuda12]' or "
    "'zinfer[gpu-cuda13]'; where CuPy is already installed, install its CUDA libraries instead "
    "(pip install 'cupy-cuda12x[ctk]' or 'cupy-cuda13x[ctk]', the one installed) rather than a second CuPy"
)

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


class _Wait:
    """What the look-ahead hook waits on: ``fd`` becomes readable once ``event`` has completed (it may
    also wake for an earlier wait's event: ``done`` tells)."""

    def __init__(self, fd: int, event: Any) -> None:
        self.fd = fd
        self._event = event

    def done(self) -> bool:
        return bool(self._event.done)


class _Waiter:
    """A thread that sleeps in blocking-sync CUDA events, one after another, and writes a byte to a pipe
    when each has completed: the look-ahead polls that pipe beside its socket instead of spinning."""

    def __init__(self, ordinal: int, cupy: Any) -> None:
        self._ordinal, self._cp = ordinal, cupy
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def watch(self, event: Any) -> _Wait:
        self._drain()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zinfer-gpu-wait", daemon=True)
            self._thread.start()
        self._events.put(event)
        return _Wait(self._read, event)

    def _drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def _run(self) -> None:
        self._cp.cuda.Device(self._ordinal).use()
        while (event := self._events.get()) is not None:
            try:
                event.synchronize()
            except Exception as exc:  # the batch's own wait reports it
                log.debug("event=gpu_wait_failed error=%r", exc)
            try:
                os.write(self._write, b"\0")
            except OSError:
                return

    def close(self) -> None:
        if self._thread is not None:
            self._events.put(None)
            self._thread.join(timeout=5.0)  # an event stuck on a hung GPU must not hold the exit
        os.close(self._read)
        os.close(self._write)


def _ordinal(index: int) -> int:
    """The CUDA device number of ``gpu:<index>`` in this process: 0 where the supervisor narrowed
    ``CUDA_VISIBLE_DEVICES`` to that GPU (``ZINFER_DEVICE`` says which), else ``index``."""
    return 0 if os.environ.get(DEVICE_ENV) == f"gpu:{index}" else index


class GpuDevice:
    kind = "GPU"
    is_host = False

    def __init__(self, index: int) -> None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a CUDA library that fails to load
            raise ConfigError(
                f"device gpu:{index}: CuPy cannot be imported ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
            ) from None
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:
            raise ConfigError(f"device gpu:{index}: no usable CUDA device ({exc})") from None
        ordinal = _ordinal(index)
        if not 0 <= ordinal < count:
            raise ConfigError(f"device gpu:{index}: only {count} GPU(s) are visible to this process")
        self.cp: Any = cupy
        self.xp: ModuleType = cupy
        self.id = index
        self.ordinal = ordinal  # the CUDA device number in this process
        self.spec = f"gpu:{index}"
        self.device = cupy.cuda.Device(ordinal)
        self.device.use()
        # compute, and the copies back to the host; blocking, so null-stream work is ordered with it
        self.stream = cupy.cuda.Stream(non_blocking=False)
        self.stream.__enter__()  # pushed for good: leaving any ``with`` block comes back to it
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)  # host-to-device copies only
        self.on_wait: WaitHook | None = None  # run by synchronize before it blocks (the worker's look-ahead)
        self.stray_streams = 0  # batches whose model left another stream current
        self.staged_batches = 0  # batches whose inputs were staged ahead
        self.staged_hits = 0  # batch arrays served from a staged copy
        self._staged: tuple[object, dict[PieceKey, list[_Copied]]] = (None, {})
        self._ready: dict[PieceKey, list[_Copied]] = {}  # the staged copies of the batch now running
        self._in_use: list[_Copied] = []  # input copies of the running batch, held until synchronize
        self._pinned: dict[str, int] = {}
        self._keep: list[Any] = []  # device temporaries read by copies still in flight
        self._pin_failed = False
        self._waiter = _Waiter(ordinal, cupy)
        self._warm_up()

    def _warm_up(self) -> None:
        """A small GEMM (cuBLAS) and elementwise kernel (NVRTC) on the compute stream, checked: CUDA
        libraries that are missing, or of another CUDA major than CuPy's, fail here, at load."""
        cp = self.cp
        a = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
        want = np.maximum(a @ a - 0.5, 0)
        try:
            x = cp.asarray(a)
            got = cp.maximum(cp.subtract(cp.matmul(x, x), 0.5), 0).get(stream=self.stream)
        except Exception as exc:
            raise ConfigError(
                f"device {self.spec}: CUDA cannot run a kernel ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
            ) from None
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            raise ConfigError(f"device {self.spec}: a warm-up GEMM gave a wrong result (GPU unusable)")
        self.stream.synchronize()

    def _current(self) -> Any:
        return self.cp.cuda.get_current_stream()

    def _compute_current(self) -> Any:
        """Make the compute stream current again; the stream that was current instead, or None."""
        stray = self._current()
        if stray == self.stream:
            return None
        self.stream.use()
        return stray

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
        if not self._in_use:  # the first input of a batch: its kernels run on the compute stream
            stray = self._compute_current()
            if stray is not None:
                log.warning("event=stray_stream device=%s stream=%r at=batch_start", self.spec, stray)
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
        cp = self.cp
        if isinstance(value, cp.ndarray):
            return value  # type: ignore[no-any-return]
        if not isinstance(value, np.ndarray):
            dlpack_device = getattr(value, "__dlpack_device__", None)
            if dlpack_device is not None and hasattr(value, "__dlpack__"):
                if int(dlpack_device()[0]) in _DLPACK_CUDA:
                    with self.stream:  # the consumer stream the producer orders its work before
                        out: Array = cp.from_dlpack(value)
                    return out
            if hasattr(value, "__cuda_array_interface__"):
                view: Array = cp.asarray(value)  # zero-copy; CuPy waits for a stream the producer names
                return view
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
        """Wait for the compute stream (the batch and its copies back); staged copies keep running.

        Raises InternalError when the model left another stream current (its kernels ran unordered with
        the copies): that stream's work is waited for too, and the compute stream is current again."""
        stray = self._compute_current()
        if stray is not None:
            self.stream.wait_event(stray.record())
            self.stray_streams += 1
        hook = self.on_wait
        done = self.cp.cuda.Event(block=True, disable_timing=True)  # the host sleeps in its synchronize
        done.record(self.stream)
        if hook is not None:
            try:
                hook(self._waiter.watch(done))
            except Exception:  # the look-ahead is an optimisation: it never fails the batch
                log.exception("event=look_ahead_failed device=%s", self.spec)
        done.synchronize()
        self.stream.synchronize()  # already done: returns at once
        self._keep.clear()
        self._in_use.clear()
        if stray is not None:
            log.error("event=stray_stream device=%s stream=%r", self.spec, stray)
            raise InternalError(
                f"the model left CUDA stream {stray!r} current: its kernels must run on the instance's "
                "compute stream (use `with stream:` blocks, which restore it, not Stream.use())"
            )

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

    def memory_used(self) -> int:
        """Device memory this worker holds through CuPy's default pool on its device (in use and cached),
        for on-demand model control's device budgets (sent with each heartbeat)."""
        with self.device:
            return int(self.cp.get_default_memory_pool().total_bytes())

    def close(self) -> None:
        try:
            self.copy_stream.synchronize()
            self.stream.synchronize()
        finally:
            self._waiter.close()
            if self._current() == self.stream:  # pushed at open: popped, so a later device starts clean
                self.stream.__exit__(None, None, None)
            self._keep.clear()
            self._in_use.clear()
            self._ready = {}
            self._staged = (None, {})
