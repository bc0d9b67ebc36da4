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

``set_busy(predicate)`` makes ``Event.done`` report False while ``predicate()`` holds (the GPU "still
computing"), for code that polls events; ``COMPUTE_S`` makes each event report done only that long after
it was recorded. ``module(device_count)`` builds the fake without installing it (for a ``cupy`` shim that
lets worker processes run on it).
"""

from __future__ import annotations

import itertools
import sys
import time
import types
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
_CURRENT: list[_Stream] = []
_BUSY: list[Callable[[], bool]] = []
COMPUTE_S = 0.0


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

    def __init__(self, non_blocking: bool = False) -> None:
        self.id = next(self._ids)
        self.ptr = 1000 + self.id
        self.clock: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<fake stream {self.id}>"

    def _op(self, kind: str, detail: Any = None) -> int:
        _merge(self.clock, _HOST)  # work issued now starts after everything the host has waited for
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

    def use(self) -> None:
        CALLS.append(("stream_use", None))
        _CURRENT[:] = [self]

    def __enter__(self) -> _Stream:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.pop()

    def synchronize(self) -> None:
        CALLS.append(("sync", None))
        self._host_wait()

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


NULL_STREAM = _Stream()


def current() -> _Stream:
    return _CURRENT[-1] if _CURRENT else NULL_STREAM


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

    @property
    def done(self) -> bool:
        if any(busy() for busy in _BUSY) or time.monotonic() < self.recorded_at + COMPUTE_S:
            return False
        _merge(_HOST, self.clock)
        return True

    def synchronize(self) -> None:
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
        if isinstance(result, np.ndarray):
            result = result.view(FakeDeviceArray)
            if not outs:
                stream.write(result, ufunc.__name__)
            return result
        return result

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> Any:
        s = stream or current()
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


def _to_device(a: Any, dtype: Any = None) -> FakeDeviceArray:
    if isinstance(a, FakeDeviceArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    out = np.array(a, dtype=dtype).view(FakeDeviceArray)
    current()._op("set", out.shape)
    current().write(out, "asarray")
    return out


def _contiguous(a: FakeDeviceArray) -> FakeDeviceArray:
    if a.flags.c_contiguous:
        return a
    out = np.ascontiguousarray(a.view(np.ndarray)).view(FakeDeviceArray)
    current()._op("kernel", "copy")
    current().read(a, "ascontiguousarray")
    current().write(out, "ascontiguousarray")
    return out


def module(device_count: int) -> types.ModuleType:
    mod = types.ModuleType("cupy")
    mod.ndarray = FakeDeviceArray  # type: ignore[attr-defined]
    mod.asarray = _to_device  # type: ignore[attr-defined]
    mod.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(FakeDeviceArray)  # type: ignore[attr-defined]
    mod.ascontiguousarray = _contiguous  # type: ignore[attr-defined]
    for name in ("matmul", "add", "subtract", "maximum", "negative", "exp", "reciprocal", "tanh", "multiply"):
        setattr(mod, name, getattr(np, name))

    def host_register(ptr: int, size: int, flags: int) -> None:
        CALLS.append(("register", size))

    def host_unregister(ptr: int) -> None:
        CALLS.append(("unregister", None))

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: device_count,
        getDeviceProperties=lambda i: {"name": b"fake GPU"},
        hostRegister=host_register,
        hostUnregister=host_unregister,
    )
    mod.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=runtime, Device=_Device, Stream=_Stream, Event=_Event, get_current_stream=current
    )
    return mod


def reset() -> None:
    global COMPUTE_S
    COMPUTE_S = 0.0
    NULL_STREAM.clock.clear()
    CALLS.clear()
    OPS.clear()
    HAZARDS.clear()
    _HOST.clear()
    _BUFFERS.clear()
    _CURRENT.clear()
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
