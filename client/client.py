"""The synchronous client: ``Client(url).infer(model, {name: array})``.

One DEALER socket per client, safe to share between threads: each call registers a waiter for its
request id; whichever waiting thread holds the receive lock reads replies for everyone.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import dtypes, protocol
from .arena import Arena, Slot
from .connection import Connection, CurveKeys
from .errors import (
    ClientError,
    ConnectionFailed,
    ProtocolError,
    RequestTimeout,
    Status,
    UnknownRegion,
    from_status,
)
from .paths import default_url
from .protocol import Command, Frame, InferRequest, OutputRequest, Reply, ShmRef, TensorRef
from .result import InferResult
from .shm import Segment

log = logging.getLogger(__name__)

_POLL_SLICE_S = 0.001  # receive slice while other threads are waiting to send


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
        curve: CurveKeys | None = None,
    ) -> None:
        self.url = url or default_url()
        self.timeout = timeout
        self.inline_threshold = inline_threshold
        self._use_shm = self.url.startswith("ipc://") if shm is None else shm
        self._conn = Connection(self.url, on_late_reply=self._late_reply, curve=curve)
        self._orphans_lock = threading.Lock()
        self._orphans: dict[str, list[Slot]] = {}  # slots of requests in flight, by request id
        self._active: dict[str, str] = {}  # caller's request_id -> wire id, for cancel()
        self._models: dict[tuple[str, int], _ModelInfo] = {}
        # arrays made by empty(): id of their base memoryview -> (that memoryview, its slot)
        self._owned: dict[int, tuple[memoryview, Slot]] = {}
        self._arena_args = (arena_bytes, max_arena_bytes)
        self._arena: Arena | None = None
        self._closed = False

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
        self._conn.close()

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

    def load_model(self, name: str, timeout: float | None = None) -> None:
        """Load or reload ``name`` from the repository (needs ``--model-control-mode explicit``).

        Returns once every instance of the new version is ready; requests keep going to the old version until
        then. Raises ``Unavailable`` with the reason if it fails, in which case the old version keeps serving.
        """
        self._call(Command.LOAD, {"model": name}, timeout=timeout)
        self._models = {k: v for k, v in self._models.items() if k[0] != name}

    def unload_model(self, name: str) -> None:
        """Stop serving ``name``: new requests are refused, queued ones finish."""
        self._call(Command.UNLOAD, {"model": name})
        self._models = {k: v for k, v in self._models.items() if k[0] != name}

    def server_status(self) -> dict[str, Any]:
        """What ``zinfer status`` shows: models, instances (pid, device, state, RSS, CPU), queues, figures."""
        body: dict[str, Any] = self._call(Command.SERVER_STATUS, {}).body
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
        priority: int = 0,
        timeout: int | None = None,
        client_timeout: float | None = None,
    ) -> InferResult:
        """Run ``model`` on ``inputs`` and return its outputs (all of them unless ``outputs`` names some).

        As in Triton's client: ``priority`` is the request's priority level (0 = the model's default, 1 =
        highest) and ``timeout`` its queue timeout in microseconds, honoured where the model's queue policy
        allows an override. ``client_timeout`` (seconds, default: the client's ``timeout``) is how long to
        wait for the answer; when it passes the request is cancelled in the server and ``RequestTimeout``
        is raised. ``request_id`` names the request for ``cancel`` from another thread.
        """
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
            priority=priority,
            timeout_us=timeout or 0,
        )
        header = protocol.infer_to_wire(req)
        try:
            self._conn.check_server()  # nothing sent yet: a missing server frees the slots below
            reply, rframes = self._send_infer(header, frames, slots, client_timeout, request_id)
            if reply.status == Status.INVALID_ARGUMENT and reply.error.startswith(UnknownRegion.__name__):
                # the server restarted and forgot our regions: register them again and retry once
                self._register_all()
                reply, rframes = self._send_infer(header, frames, slots, client_timeout, request_id)
        except (RequestTimeout, ConnectionFailed) as exc:
            if not self._orphans_has(header["id"]):
                self._free(slots)
            raise exc  # else the server may still use the slots: they stay reserved until a late reply
        except BaseException:
            self._free(slots)
            raise
        try:
            if reply.status != Status.OK:
                raise from_status(reply.status, reply.error)
            result = self._read_outputs(reply, rframes, out_slots, request_id or "")
        finally:
            self._free([s for s in slots if s not in out_slots.values()])
        return result

    def _send_infer(
        self,
        header: dict[str, Any],
        frames: Sequence[Frame],
        slots: list[Slot],
        timeout: float | None,
        user_id: str | None,
    ) -> tuple[Reply, list[Frame]]:
        rid = header["id"] = self._conn.new_id()
        with self._orphans_lock:
            if slots:  # until the reply comes the server may read or write them, even after a timeout
                self._orphans[rid] = slots
            if user_id:
                self._active[user_id] = rid
        try:
            reply, rframes = self._conn.request(
                Command.INFER, header, frames, self.timeout if timeout is None else timeout
            )
        except RequestTimeout:
            self._conn.send_only(Command.CANCEL, {"target": rid})  # the server drops it or its result
            raise
        finally:
            if user_id:
                with self._orphans_lock:
                    self._active.pop(user_id, None)
        if slots:
            with self._orphans_lock:
                self._orphans.pop(rid, None)
        return reply, rframes

    def cancel(self, request_id: str) -> bool:
        """Cancel the running ``infer`` that was given this ``request_id`` (from another thread): it leaves
        the server's queue, or its result is discarded, and that ``infer`` raises ``Cancelled``. Returns
        False when no such request is in flight."""
        with self._orphans_lock:
            rid = self._active.get(request_id)
        if rid is None:
            return False
        self._call(Command.CANCEL, {"target": rid})
        return True

    def _orphans_has(self, rid: str) -> bool:
        with self._orphans_lock:
            return rid in self._orphans

    def _register_all(self) -> None:
        if self._arena is not None:
            for seg in self._arena.segments:
                self._register(seg)

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
        reply: Reply
        reply, _ = self._conn.request(command, header, (), self.timeout if timeout is None else timeout)
        if reply.status != Status.OK:
            raise from_status(reply.status, reply.error)
        return reply

    def _late_reply(self, request_id: str) -> None:
        """A timed-out request finished after all: now its slots may be reused."""
        with self._orphans_lock:
            slots = self._orphans.pop(request_id, [])
        self._free(slots)
