"""A stand-in for CuPy, so the unit tests drive the GPU code paths on machines without a GPU.

Device arrays are NumPy arrays of a subclass (:class:`FakeDeviceArray`) with CuPy's ``get``/``set``;
ufuncs refuse to mix them with plain host arrays, as CuPy does. ``install(monkeypatch)`` puts the fake in
``sys.modules["cupy"]`` and returns it; ``calls`` records host registrations and stream use.

Streams and events: every operation runs at once (NumPy), but each is also logged in :data:`OPS` with
the stream it was issued on, in issue order (``set`` H2D copy, ``get`` D2H copy, ``kernel``, ``record``,
``wait``, ``sync``), and checked against CUDA's ordering rules with vector clocks: work on one stream is
ordered; across streams only through ``Stream.wait_event`` on an event recorded after the work, or through
the host having waited (``Stream.synchronize``, ``Event.synchronize``, a ``done`` event). A device buffer
read on one stream after an unordered write on another (or written while another stream's read is not
ordered before it) is a race on a real GPU; each one is appended to :data:`HAZARDS`.

Which stream is current follows CuPy's rules (``cupy/cuda/stream.pyx``, v13.6 to v14.2): per thread and
per device there is a current stream and a stack that starts as ``[null stream]``; ``Stream.use()`` sets
the current stream without touching the stack; ``with stream:`` pushes it, and leaving the block pops and
makes the new top of the stack current (so ``s.use()`` then ``with other:`` leaves the null stream current,
as CuPy's ``test_mix_use_context`` asserts). A blocking stream (``non_blocking=False``) and the legacy null
stream are ordered with each other both ways; a non-blocking stream is not ordered with the null stream.

Memory follows CuPy's pool: ``empty``, ``asarray`` and kernel results take a block from the arena of the
stream current at allocation; when the array (and every view of it) is gone, the block goes back to that
same arena and the next allocation of that size on that stream reuses it at once, without any wait. So a
block freed while another stream still reads it is rewritten by the next copy into it: a race, reported.

``set_busy(predicate)`` makes ``Event.done`` report False (and ``Event.synchronize`` wait) while
``predicate()`` holds (the GPU "still computing"); ``COMPUTE_S`` makes each event report done only that
long after it was recorded; :data:`QUERIES` counts ``Event.done`` queries (a host spinning on an event
shows as thousands). ``module(device_count)`` builds the fake without installing it (for a ``cupy`` shim
that lets worker processes run on it); its device count honours ``CUDA_VISIBLE_DEVICES`` as CUDA does.
Device arrays of other libraries come in through ``asarray`` (``__cuda_array_interface__``, zero-copy)
and ``from_dlpack`` (``__dlpack__`` with the consumer's current stream, recorded in :data:`CALLS`).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest


@dataclass(frozen=True)
class Op:
    stream: _Stream
    kind: str  # set, get, kernel, record, wait, sync
    detail: Any = None


CALLS: list[tuple[str, Any]] = []
OPS: list[Op] = []
HAZARDS: list[str] = []
_SEQ = itertools.count(1)
_HOST: dict[int, int] = {}  # what the host knows to be finished: stream id -> op seq
_BUFFERS: dict[int, _Buffer] = {}
_BUSY: list[Callable[[], bool]] = []
_BLOCKING: weakref.WeakSet[_Stream] = weakref.WeakSet()  # streams ordered with the legacy null stream
COMPUTE_S = 0.0
QUERIES = [0]  # Event.done queries
POOL_ROUND = 512  # CuPy rounds allocations up to 512 bytes


class _ThreadState(threading.local):
    """CuPy's ``_ThreadLocal``: per thread, the current device, and per device the current stream and
    the stack ``with`` blocks push on (which starts as the null stream alone)."""

    def __init__(self) -> None:
        self.device = 0
        self.current: dict[int, _Stream] = {}
        self.stacks: dict[int, list[_Stream]] = {}
        self.device_stack: list[int] = []

    def stack(self, device: int) -> list[_Stream]:
        return self.stacks.setdefault(device, [NULL_STREAM])


_TLS = _ThreadState()


class _Pool:
    """CuPy's memory pool as far as ordering goes: free blocks by the stream that allocated them."""

    def __init__(self) -> None:
        self.free: dict[tuple[int, int], list[np.ndarray]] = {}  # type: ignore[type-arg]
        self.reused = 0

    def malloc(self, nbytes: int, stream: _Stream) -> np.ndarray:  # type: ignore[type-arg]
        size = max(POOL_ROUND, -(-nbytes // POOL_ROUND) * POOL_ROUND)
        blocks = self.free.get((stream.id, size))
        if blocks:
            self.reused += 1
            return blocks.pop()
        return np.empty(size, np.uint8)

    def give_back(self, stream_id: int, block: np.ndarray) -> None:  # type: ignore[type-arg]
        self.free.setdefault((stream_id, block.size), []).append(block)


POOL = _Pool()


def _merge(into: dict[int, int], other: dict[int, int]) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class _Buffer:
    """Who last wrote a device allocation, and who read it since."""

    def __init__(self, root: np.ndarray) -> None:  # type: ignore[type-arg]
        self.root = root  # kept alive, so its id is never reused while it is tracked
        self.write: tuple[int, int] | None = None  # (stream id, seq)
        self.reads: dict[int, int] = {}


def _buffer(a: np.ndarray) -> _Buffer:  # type: ignore[type-arg]
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    buf = _BUFFERS.get(id(root))
    if buf is None:
        buf = _BUFFERS[id(root)] = _Buffer(root)
    return buf


class _Stream:
    _ids = itertools.count(1)

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        self.id = next(self._ids)
        self.ptr = 0 if null else 1000 + self.id
        self.device_id = -1 if null else _TLS.device
        self.non_blocking = non_blocking
        self.clock: dict[int, int] = {}
        if not non_blocking and not null:
            _BLOCKING.add(self)

    def __repr__(self) -> str:
        return f"<fake stream {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return self.ptr

    @property
    def is_non_blocking(self) -> bool:
        return self.non_blocking

    def _op(self, kind: str, detail: Any = None) -> int:
        _merge(self.clock, _HOST)  # work issued now starts after everything the host has waited for
        if self.ptr == 0:  # the legacy null stream waits for all work of the blocking streams
            for other in list(_BLOCKING):
                _merge(self.clock, other.clock)
        elif not self.non_blocking:  # and a blocking stream's work waits for the null stream's
            _merge(self.clock, NULL_STREAM.clock)
        seq = next(_SEQ)
        self.clock[self.id] = seq
        OPS.append(Op(self, kind, detail))
        return seq

    def read(self, a: np.ndarray, what: str) -> None:  # type: ignore[type-arg]
        seq = self._op_seq_for_access()
        buf = _buffer(a)
        if buf.write is not None:
            stream, wseq = buf.write
            if stream != self.id and self.clock.get(stream, 0) < wseq:
                HAZARDS.append(f"{what} on stream {self.id} reads what stream {stream} wrote, unordered")
        buf.reads[self.id] = seq

    def write(self, a: np.ndarray, what: str) -> None:  # type: ignore[type-arg]
        seq = self._op_seq_for_access()
        buf = _buffer(a)
        if buf.write is not None:
            stream, wseq = buf.write
            if stream != self.id and self.clock.get(stream, 0) < wseq:
                HAZARDS.append(f"{what} on stream {self.id} overwrites stream {stream}'s write, unordered")
        for stream, rseq in buf.reads.items():
            if stream != self.id and self.clock.get(stream, 0) < rseq:
                HAZARDS.append(f"{what} on stream {self.id} overwrites what stream {stream} reads, unordered")
        buf.write, buf.reads = (self.id, seq), {}

    def _op_seq_for_access(self) -> int:
        return self.clock[self.id]  # the access belongs to the op just logged

    def _device(self) -> int:
        return _TLS.device if self.device_id == -1 else self.device_id

    def use(self) -> _Stream:
        """Current, without touching the stack (CuPy's ``set_current_stream``)."""
        CALLS.append(("stream_use", None))
        _TLS.current[self._device()] = self
        return self

    def __enter__(self) -> _Stream:
        device = self._device()
        if device != _TLS.device:
            raise RuntimeError(f"The device that the stream is created on ({device}) does not match")
        _TLS.stack(device).append(self)
        _TLS.device_stack.append(device)
        _TLS.current[device] = self
        return self

    def __exit__(self, *exc: object) -> None:
        device = _TLS.device_stack.pop()
        stack = _TLS.stack(device)
        stack.pop()
        _TLS.current[device] = stack[-1]  # the top of the stack, not what was current before

    @property
    def done(self) -> bool:
        return not _busy()

    def synchronize(self) -> None:
        CALLS.append(("sync", None))
        self._host_wait()  # at once: only events model a GPU still computing (set_busy, COMPUTE_S)

    def _host_wait(self) -> None:
        self._op("sync")
        _merge(_HOST, self.clock)

    def wait_event(self, event: _Event) -> None:
        self._op("wait", event)
        _merge(self.clock, event.clock)

    def record(self, event: _Event | None = None) -> _Event:
        event = event or _Event()
        event.record(self)
        return event


NULL_STREAM = _Stream(null=True)


def current(device: int = -1) -> _Stream:
    """CuPy's ``get_current_stream``: this thread's current stream on the current device."""
    return _TLS.current.get(_TLS.device if device == -1 else device, NULL_STREAM)


def _busy() -> bool:
    return any(busy() for busy in _BUSY)


class _Event:
    _ids = itertools.count(1)

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.id = next(self._ids)
        self.clock: dict[int, int] = {}
        self.stream: _Stream | None = None
        self.recorded_at = 0.0

    def __repr__(self) -> str:
        return f"<fake event {self.id} on {self.stream}>"

    def record(self, stream: _Stream | None = None) -> None:
        stream = stream or current()
        stream._op("record", self)
        self.stream = stream
        self.clock = dict(stream.clock)
        self.recorded_at = time.monotonic()

    def _finished(self) -> bool:
        return not _busy() and time.monotonic() >= self.recorded_at + COMPUTE_S

    @property
    def done(self) -> bool:
        QUERIES[0] += 1
        if not self._finished():
            return False
        _merge(_HOST, self.clock)
        return True

    def synchronize(self) -> None:
        while not self._finished():
            time.sleep(0.001)
        _merge(_HOST, self.clock)


class FakeDeviceArray(np.ndarray):  # type: ignore[type-arg]
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        for x in (*inputs, *kwargs.get("out", ())):
            if isinstance(x, np.ndarray) and not isinstance(x, FakeDeviceArray) and x.ndim:
                raise TypeError(f"Unsupported type {type(x)} (a host array given to a device ufunc)")
        stream = current()
        stream._op("kernel", ufunc.__name__)
        for x in inputs:
            if isinstance(x, FakeDeviceArray):
                stream.read(x, ufunc.__name__)
        args = [x.view(np.ndarray) if isinstance(x, FakeDeviceArray) else x for x in inputs]
        outs = kwargs.get("out", ())
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) for o in kwargs["out"])
        result = getattr(ufunc, method)(*args, **kwargs)
        for o in outs:
            stream.write(o, ufunc.__name__)
        if isinstance(result, np.ndarray) and not outs:
            out = _alloc(result.shape, result.dtype, stream)  # from the current stream's arena
            out.view(np.ndarray)[...] = result
            stream.write(out, ufunc.__name__)
            return out
        if isinstance(result, np.ndarray):
            return result.view(FakeDeviceArray)
        return result

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> Any:
        s = stream or current()
        if not self.flags.c_contiguous:  # CuPy copies it first, inside ``with stream:``
            with s:
                return _contiguous(self).get(stream=s, order=order, out=out, blocking=blocking)
        s._op("get", self.shape)
        s.read(self, "get")
        if blocking:
            s._host_wait()
        host = np.array(self.view(np.ndarray), order=order)
        if out is None:
            return host
        assert type(out) is np.ndarray and out.flags.c_contiguous and out.shape == self.shape
        assert out.dtype == self.dtype
        CALLS.append(("get", blocking))
        out[...] = host
        return out

    def set(self, arr: Any, stream: Any = None) -> None:
        assert type(arr) is np.ndarray and arr.flags.c_contiguous, "set() takes a contiguous host array"
        assert arr.shape == self.shape and arr.dtype == self.dtype
        assert self.flags.c_contiguous
        s = stream or current()
        s._op("set", arr.shape)
        s.write(self, "set")
        CALLS.append(("set", arr.shape))
        self.view(np.ndarray)[...] = arr


class _Device:
    def __init__(self, index: int) -> None:
        self.id = index

    def use(self) -> None:
        CALLS.append(("device", self.id))
        _TLS.device = self.id


def _alloc(shape: Any, dtype: Any, stream: _Stream | None = None) -> FakeDeviceArray:
    """A device array in a pool block of ``stream``'s arena (the current stream's by default); the block
    goes back to that arena when the array and all its views are gone."""
    stream = stream or current()
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    block = POOL.malloc(count * dtype.itemsize, stream)
    arr = block[: count * dtype.itemsize].view(dtype).reshape(shape).view(FakeDeviceArray)
    weakref.finalize(arr, POOL.give_back, stream.id, block)
    return arr


def _empty(shape: Any, dtype: Any = float) -> FakeDeviceArray:
    return _alloc(shape, dtype)


def _foreign(a: Any) -> FakeDeviceArray:
    """A zero-copy view of another library's device array (its ``__cuda_array_interface__``)."""
    iface = a.__cuda_array_interface__
    dtype, shape = np.dtype(iface["typestr"]), tuple(iface["shape"])
    nbytes = math.prod(shape) * dtype.itemsize
    raw = (ctypes.c_byte * max(nbytes, 1)).from_address(iface["data"][0])
    raw.owner = a  # type: ignore[attr-defined]  # the producer lives as long as the view
    CALLS.append(("cuda_array_interface", shape))
    return np.frombuffer(raw, dtype, count=math.prod(shape)).reshape(shape).view(FakeDeviceArray)


def _to_device(a: Any, dtype: Any = None) -> FakeDeviceArray:
    if isinstance(a, FakeDeviceArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    if hasattr(a, "__cuda_array_interface__"):
        return _foreign(a)
    host = np.asarray(a, dtype=dtype)
    out = _alloc(host.shape, host.dtype)
    out.view(np.ndarray)[...] = host
    current()._op("set", out.shape)
    current().write(out, "asarray")
    return out


KDL_CUDA = 2


def _from_dlpack(a: Any) -> FakeDeviceArray:
    """CuPy's ``from_dlpack``: the producer is asked for its tensor on the consumer's current stream."""
    kind, _ = a.__dlpack_device__()
    if kind != KDL_CUDA:
        raise BufferError(f"from_dlpack: device type {kind} is not CUDA")
    stream = current()
    CALLS.append(("dlpack", stream))

    class _AsHost:  # the fake's "device" memory is host memory: NumPy reads the capsule
        def __dlpack__(self, **_: Any) -> Any:
            return a.__dlpack__(stream=stream.ptr)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    return np.from_dlpack(_AsHost()).view(FakeDeviceArray)


def visible_devices(device_count: int) -> int:
    """How many devices CUDA shows under ``CUDA_VISIBLE_DEVICES`` (unset: all of them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return device_count
    entries = [e.strip() for e in visible.split(",")]
    count = 0
    for e in entries:
        if not e.isdigit() or int(e) >= device_count:
            break  # CUDA stops at the first entry it cannot use
        count += 1
    return count


def _contiguous(a: FakeDeviceArray) -> FakeDeviceArray:
    if a.flags.c_contiguous:
        return a
    out = _alloc(a.shape, a.dtype)
    out.view(np.ndarray)[...] = a.view(np.ndarray)
    current()._op("kernel", "copy")
    current().read(a, "ascontiguousarray")
    current().write(out, "ascontiguousarray")
    return out


def module(device_count: int) -> types.ModuleType:
    mod = types.ModuleType("cupy")
    mod.ndarray = FakeDeviceArray  # type: ignore[attr-defined]
    mod.asarray = _to_device  # type: ignore[attr-defined]
    mod.empty = _empty  # type: ignore[attr-defined]
    mod.ascontiguousarray = _contiguous  # type: ignore[attr-defined]
    mod.from_dlpack = _from_dlpack  # type: ignore[attr-defined]
    for name in ("float16", "float32", "int32", "uint8"):
        setattr(mod, name, getattr(np, name))
    for name in ("matmul", "add", "subtract", "maximum", "negative", "exp", "reciprocal", "tanh", "multiply"):
        setattr(mod, name, getattr(np, name))

    def host_register(ptr: int, size: int, flags: int) -> None:
        CALLS.append(("register", size))

    def host_unregister(ptr: int) -> None:
        CALLS.append(("unregister", None))

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: visible_devices(device_count),
        getDevice=lambda: _TLS.device,
        getDeviceProperties=lambda i: {"name": b"fake GPU"},
        hostRegister=host_register,
        hostUnregister=host_unregister,
    )
    mod.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=runtime, Device=_Device, Stream=_Stream, Event=_Event, get_current_stream=current
    )
    return mod


def reset() -> None:
    global COMPUTE_S, _TLS, POOL
    COMPUTE_S = 0.0
    QUERIES[0] = 0
    NULL_STREAM.clock.clear()
    CALLS.clear()
    OPS.clear()
    HAZARDS.clear()
    _HOST.clear()
    _BUFFERS.clear()
    _TLS = _ThreadState()
    POOL = _Pool()
    _BUSY.clear()


def install(monkeypatch: pytest.MonkeyPatch, device_count: int = 2) -> types.ModuleType:
    reset()
    mod = module(device_count)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def set_busy(predicate: Callable[[], bool]) -> None:
    """``Event.done`` is False while ``predicate()`` is true."""
    _BUSY[:] = [predicate]


def calls(kind: str) -> list[Any]:
    return [arg for name, arg in CALLS if name == kind]


def ops(stream: Any, kind: str | None = None) -> list[Op]:
    """The operations issued on one stream (of one kind), in order."""
    return [op for op in OPS if op.stream is stream and (kind is None or op.kind == kind)]


def index(predicate: Callable[[Op], bool], start: int = 0) -> int:
    """Where in :data:`OPS` the first operation from ``start`` on matching ``predicate`` is."""
    for i in range(start, len(OPS)):
        if predicate(OPS[i]):
            return i
    raise AssertionError("no such operation")
