"""The synchronous client: ``Client(url).infer(model, {name: array})``.

One DEALER socket per client, safe to share between threads: each call registers a waiter for its
request id; whichever waiting thread holds the receive lock reads replies for everyone.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import zmq

from . import dtypes, protocol
from .arena import Arena, Slot
from .errors import ClientError, ConnectionFailed, ProtocolError, RequestTimeout, Status, from_status
from .paths import default_url
from .protocol import Command, Frame, InferRequest, OutputRequest, Reply, ShmRef, TensorRef
from .result import InferResult
from .shm import Segment
from .transport import send_frames

log = logging.getLogger(__name__)

_POLL_SLICE_S = 0.001  # receive slice while other threads are waiting to send


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    reply: Reply | None = None
    frames: list[Frame] = field(default_factory=list)


@dataclass(frozen=True)
class _OutputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as in metadata: -1 for variable dims, batch dim included


@dataclass(frozen=True)
class _ModelInfo:
    name: str
    version: int
    max_batch_size: int
    outputs: tuple[_OutputSpec, ...]


def _byte_view(arr: npt.NDArray[Any]) -> memoryview:
    """The bytes of a contiguous array (a uint8 view also works for dtypes memoryview lacks, like bf16)."""
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


class Client:
    """Talks to one zinfer server. Use as a context manager, or call ``close()``.

    ``url`` defaults to the server's socket in the default runtime directory. Tensors go through the
    client's shared-memory arena when the server is local (``ipc://``), inline in the message otherwise;
    tensors of at most ``inline_threshold`` bytes travel inline anyway, where a copy is cheaper than a
    shared-memory slot (set it to -1 to send everything through shared memory).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: float = 60.0,
        shm: bool | None = None,
        arena_bytes: int = 16 << 20,
        max_arena_bytes: int = 4 << 30,
        inline_threshold: int = 4096,
    ) -> None:
        self.url = url or default_url()
        self.timeout = timeout
        self.inline_threshold = inline_threshold
        self._use_shm = self.url.startswith("ipc://") if shm is None else shm
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.url)
        self._sock_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._waiters_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._orphans: dict[str, list[Slot]] = {}  # slots of timed-out requests, freed when their reply comes
        self._senders = 0
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}-"
        self._models: dict[tuple[str, int], _ModelInfo] = {}
        # arrays made by empty(): id of their base memoryview -> (that memoryview, its slot)
        self._owned: dict[int, tuple[memoryview, Slot]] = {}
        self._arena_args = (arena_bytes, max_arena_bytes)
        self._arena: Arena | None = None
        self._closed = False
        self._connected = False  # set by the first reply

    # ------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unregister and unlink this client's shared memory and close the socket."""
        if self._closed:
            return
        if self._arena is not None:
            for seg in self._arena.segments:
                try:
                    self._call(Command.UNREGISTER, {"name": seg.name}, timeout=min(self.timeout, 2.0))
                except ClientError:
                    pass
            self._arena.close()
        self._closed = True
        self._sock.close(linger=0)

    # ------------------------------------------------------------------------------------ server calls

    def is_server_live(self) -> bool:
        return bool(self._call(Command.SERVER_LIVE, {}).body)

    def is_server_ready(self) -> bool:
        return bool(self._call(Command.SERVER_READY, {}).body)

    def is_model_ready(self, name: str, version: int = 0) -> bool:
        return bool(self._call(Command.MODEL_READY, {"model": name, "version": version}).body)

    def model_metadata(self, name: str, version: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = self._call(Command.MODEL_METADATA, {"model": name, "version": version}).body
        return body

    def model_config(self, name: str, version: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = self._call(Command.MODEL_CONFIG, {"model": name, "version": version}).body
        return body

    def statistics(self, model: str | None = None, version: int = 0) -> dict[str, Any]:
        header: dict[str, Any] = {"version": version}
        if model is not None:
            header["model"] = model
        body: dict[str, Any] = self._call(Command.STATISTICS, header).body
        return body

    def repository_index(self) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self._call(Command.REPOSITORY_INDEX, {}).body
        return body

    # ------------------------------------------------------------------------------------ zero-copy arrays

    def empty(self, shape: Sequence[int] | int, dtype: npt.DTypeLike = np.float32) -> npt.NDArray[Any]:
        """An uninitialised array living in this client's shared memory.

        Passing it (or a contiguous slice of it) to ``infer`` sends its descriptor without copying the
        bytes. Its memory returns to the arena when the last reference to it is gone.
        """
        if not self._use_shm:
            raise ClientError("zero-copy arrays need a local (ipc://) server with shared memory")
        dt = np.dtype(dtype)
        if dt.kind in "OSU":
            raise ClientError("zero-copy arrays hold fixed-size types only, not BYTES")
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        count = math.prod(dims)
        slot = self._arena_get().alloc(max(1, count * dt.itemsize))
        flat = np.frombuffer(slot.view(), dtype=dt, count=count)
        anchor = flat.base  # the buffer object every view of this array keeps alive
        assert isinstance(anchor, memoryview)
        key = id(anchor)
        self._owned[key] = (anchor, slot)
        weakref.finalize(anchor, self._release_owned, key, slot)
        return flat.reshape(dims)

    def zeros(self, shape: Sequence[int] | int, dtype: npt.DTypeLike = np.float32) -> npt.NDArray[Any]:
        """Like ``empty``, filled with zeros."""
        arr = self.empty(shape, dtype)
        arr.fill(0)
        return arr

    def _release_owned(self, key: int, slot: Slot) -> None:
        self._owned.pop(key, None)
        self._free_slot(slot)

    def _owned_ref(self, arr: npt.NDArray[Any]) -> ShmRef | None:
        """Where ``arr`` lies in the arena, if it is a contiguous array made by ``empty``."""
        if not self._owned or not arr.flags.c_contiguous:
            return None
        base: Any = arr
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        entry = self._owned.get(id(base)) if isinstance(base, memoryview) else None
        if entry is None or entry[0] is not base:
            return None
        anchor, slot = entry
        start = arr.__array_interface__["data"][0] - np.frombuffer(anchor, dtype=np.uint8).ctypes.data
        if start < 0 or start + arr.nbytes > slot.nbytes:
            return None
        return ShmRef(slot.region, slot.offset + start, arr.nbytes)

    # ------------------------------------------------------------------------------------ inference

    def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        *,
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
        model_version: int = 0,
        timeout: float | None = None,
    ) -> InferResult:
        """Run ``model`` on ``inputs`` and return its outputs (all of them unless ``outputs`` names some)."""
        info = self._model_info(model, model_version)
        slots: list[Slot] = []
        frames: list[Frame] = []
        try:
            refs, batch = self._put_inputs(inputs, slots, frames)
            wanted = info.outputs if outputs is None else tuple(self._output_spec(info, n) for n in outputs)
            input_bytes = sum(r.shm.nbytes if r.shm else 0 for r in refs)
            out_reqs, out_slots = self._reserve_outputs(wanted, batch, info, input_bytes, slots)
        except BaseException:
            self._free(slots)
            raise
        req = InferRequest(
            request_id=request_id or "",
            model=model,
            version=model_version,
            inputs=tuple(refs),
            outputs=tuple(out_reqs),
        )
        header = protocol.infer_to_wire(req)
        reply, rframes = self._roundtrip(Command.INFER, header, frames, timeout, slots)
        try:
            if reply.status != Status.OK:
                raise from_status(reply.status, reply.error)
            result = self._read_outputs(reply, rframes, out_slots, request_id or "")
        finally:
            self._free([s for s in slots if s not in out_slots.values()])
        return result

    def _model_info(self, model: str, version: int) -> _ModelInfo:
        key = (model, version)
        info = self._models.get(key)
        if info is None:
            meta = self.model_metadata(model, version)
            outs = tuple(
                _OutputSpec(o["name"], o["datatype"], tuple(o["shape"])) for o in meta.get("outputs", [])
            )
            info = _ModelInfo(model, version, int(meta.get("max_batch_size", 0)), outs)
            self._models[key] = info
        return info

    @staticmethod
    def _output_spec(info: _ModelInfo, name: str) -> _OutputSpec:
        for spec in info.outputs:
            if spec.name == name:
                return spec
        return _OutputSpec(name, "", ())  # let the server name the error

    def _put_inputs(
        self, inputs: Mapping[str, npt.ArrayLike], slots: list[Slot], frames: list[Frame]
    ) -> tuple[list[TensorRef], int]:
        refs: list[TensorRef] = []
        batch = 1
        for i, (name, value) in enumerate(inputs.items()):
            arr = np.asarray(value)
            wire = dtypes.numpy_to_wire(arr.dtype)
            if i == 0 and arr.ndim > 0:
                batch = arr.shape[0]
            owned = self._owned_ref(arr) if self._use_shm and wire != dtypes.BYTES else None
            if owned is not None:  # already in shared memory: send where it is, no copy
                refs.append(TensorRef(name, wire, arr.shape, shm=owned))
                continue
            data: bytes | npt.NDArray[Any]
            if wire == dtypes.BYTES:
                data = dtypes.serialize_bytes(arr)
                nbytes = len(data)
            else:
                data = np.ascontiguousarray(arr)
                nbytes = data.nbytes
            if self._use_shm and nbytes > self.inline_threshold:
                slot = self._arena_get().alloc(nbytes)
                slots.append(slot)
                dst = np.frombuffer(slot.view(), dtype=np.uint8)
                src = data if isinstance(data, bytes) else data.reshape(-1).view(np.uint8)
                dst[:] = np.frombuffer(src, dtype=np.uint8) if isinstance(src, bytes) else src
                refs.append(TensorRef(name, wire, arr.shape, shm=ShmRef(slot.region, slot.offset, nbytes)))
            else:
                frames.append(data if isinstance(data, bytes) else _byte_view(data))
                refs.append(TensorRef(name, wire, arr.shape, frame=len(frames) - 1))
        return refs, batch

    def _reserve_outputs(
        self,
        wanted: Sequence[_OutputSpec],
        batch: int,
        info: _ModelInfo,
        input_bytes: int,
        slots: list[Slot],
    ) -> tuple[list[OutputRequest], dict[str, Slot]]:
        reqs: list[OutputRequest] = []
        out_slots: dict[str, Slot] = {}
        for spec in wanted:
            size = self._output_capacity(spec, batch, info, input_bytes)
            if not self._use_shm or size is None or size <= self.inline_threshold:
                reqs.append(OutputRequest(spec.name))
                continue
            slot = self._arena_get().alloc(size)
            slots.append(slot)
            out_slots[spec.name] = slot
            reqs.append(OutputRequest(spec.name, ShmRef(slot.region, slot.offset, size)))
        return reqs, out_slots

    @staticmethod
    def _output_capacity(spec: _OutputSpec, batch: int, info: _ModelInfo, input_bytes: int) -> int | None:
        """Bytes to reserve for an output: exact when the config fixes its size, else a guess the size of
        the inputs (the server falls back to an inline frame when the output does not fit)."""
        if not spec.datatype or spec.datatype == dtypes.BYTES:
            return None
        dims = spec.shape[1:] if info.max_batch_size > 0 else spec.shape
        if all(d >= 0 for d in dims):
            rows = batch if info.max_batch_size > 0 else 1
            return rows * math.prod(dims) * dtypes.itemsize(spec.datatype)
        return input_bytes if input_bytes >= 4096 else None

    def _read_outputs(
        self, reply: Reply, frames: list[Frame], out_slots: dict[str, Slot], request_id: str
    ) -> InferResult:
        body = reply.body
        if not isinstance(body, dict):
            raise ProtocolError("malformed infer reply")
        arrays: dict[str, npt.NDArray[np.generic]] = {}
        used: set[str] = set()
        for d in body.get("outputs", []):
            ref = protocol.tensor_from_wire(d)
            arrays[ref.name] = self._output_array(ref, frames, out_slots, used)
        for name, slot in out_slots.items():
            if name not in used:
                self._free([slot])
        return InferResult(str(body.get("model", "")), int(body.get("version", 0)), request_id, arrays)

    def _output_array(
        self, ref: TensorRef, frames: list[Frame], out_slots: dict[str, Slot], used: set[str]
    ) -> npt.NDArray[np.generic]:
        count = math.prod(ref.shape)
        if ref.frame is not None:
            if ref.frame >= len(frames):
                raise ProtocolError("reply names a missing frame")
            buf = memoryview(frames[ref.frame])
            if ref.datatype == dtypes.BYTES:
                return dtypes.deserialize_bytes(buf, ref.shape)
            return np.frombuffer(buf, dtype=dtypes.wire_to_numpy(ref.datatype), count=count).reshape(
                ref.shape
            )
        slot = out_slots.get(ref.name)
        if ref.shm is None or slot is None or ref.shm.region != slot.region or ref.shm.nbytes > slot.nbytes:
            raise ProtocolError("reply names shared memory this request did not reserve")
        used.add(ref.name)
        view = slot.view()[: ref.shm.nbytes]
        if ref.datatype == dtypes.BYTES:
            out = dtypes.deserialize_bytes(view, ref.shape)
            view.release()
            self._free([slot])
            return out
        # A zero-copy view: the slot goes back to the arena when the last array over it is gone.
        flat = np.frombuffer(view, dtype=dtypes.wire_to_numpy(ref.datatype), count=count)
        weakref.finalize(flat.base, self._free_slot, slot)
        return flat.reshape(ref.shape)

    # ------------------------------------------------------------------------------------ shm

    def _arena_get(self) -> Arena:
        if self._arena is None:
            initial, maximum = self._arena_args
            self._arena = Arena(initial, maximum, on_new_segment=self._register)
        return self._arena

    def _register(self, seg: Segment) -> None:
        self._call(Command.REGISTER, {"name": seg.name})

    def _free_slot(self, slot: Slot) -> None:
        if self._arena is not None:
            self._arena.free(slot)

    def _free(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            self._free_slot(slot)

    # ------------------------------------------------------------------------------------ transport

    def _call(self, command: Command, header: dict[str, Any], timeout: float | None = None) -> Reply:
        reply, _ = self._roundtrip(command, header, (), timeout, ())
        if reply.status != Status.OK:
            raise from_status(reply.status, reply.error)
        return reply

    def _roundtrip(
        self,
        command: Command,
        header: dict[str, Any],
        frames: Sequence[Frame],
        timeout: float | None,
        slots: Sequence[Slot],
    ) -> tuple[Reply, list[Frame]]:
        if self._closed:
            raise ClientError("the client is closed")
        if not self._connected:
            self._check_endpoint()
        rid = f"{self._id_prefix}{next(self._ids)}"
        header["id"] = rid
        waiter = _Waiter()
        with self._waiters_lock:
            self._waiters[rid] = waiter
        msg = protocol.encode(command, header, frames)
        with self._waiters_lock:
            self._senders += 1
        try:
            with self._sock_lock:
                send_frames(self._sock, msg)
        finally:
            with self._waiters_lock:
                self._senders -= 1
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            self._wait(waiter, deadline)
        except RequestTimeout:
            with self._waiters_lock:
                self._waiters.pop(rid, None)
                if slots:  # the server may still read or write them: keep them until its reply comes
                    self._orphans[rid] = list(slots)
            raise
        assert waiter.reply is not None
        return waiter.reply, waiter.frames

    def _check_endpoint(self) -> None:
        if self.url.startswith("ipc://") and not os.path.exists(self.url[len("ipc://") :]):
            raise ConnectionFailed(f"no zinfer server at {self.url}")

    def _wait(self, waiter: _Waiter, deadline: float) -> None:
        while not waiter.event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeout("no reply from the server within the timeout")
            if not self._recv_lock.acquire(blocking=False):
                waiter.event.wait(min(remaining, _POLL_SLICE_S * 5))
                continue
            try:
                if not waiter.event.is_set():
                    self._receive(min(remaining, _POLL_SLICE_S if self._senders else 0.05))
            finally:
                self._recv_lock.release()

    def _receive(self, wait_s: float) -> None:
        got: list[list[zmq.Frame]] = []
        sock = self._sock
        with self._sock_lock:
            if sock.poll(max(1, int(wait_s * 1000)), zmq.POLLIN):
                while len(got) < 1024:
                    got.append(sock.recv_multipart(copy=False))
                    if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                        break
        for raw in got:
            self._dispatch([f.buffer if isinstance(f, zmq.Frame) else f for f in raw])

    def _dispatch(self, raw: list[Any]) -> None:
        try:
            msg = protocol.decode(raw, frozenset({Command.REPLY}))
            reply = protocol.reply_from_wire(msg.header)
        except ProtocolError as exc:
            log.warning("event=bad_reply error=%r", str(exc))
            return
        with self._waiters_lock:
            waiter = self._waiters.pop(reply.request_id, None)
            orphan = self._orphans.pop(reply.request_id, None)
        if orphan:
            self._free(orphan)
        self._connected = True
        if waiter is not None:
            waiter.reply = reply
            waiter.frames = msg.frames
            waiter.event.set()
