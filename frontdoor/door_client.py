"""The bridge's connection to the broker: an ``AsyncClient`` whose inference takes the door's call as it is.

``infer_call`` turns an ``InferCall`` straight into zinfer's wire request (``protocol.infer_to_wire`` of an
``InferRequest`` whose tensors name the call's own buffers as frames, or their arena slots), and the reply's
frames and slots straight into the reply's tensors (zero-copy arrays over them): no dict of arrays, no
``InferResult``, no second pass over the outputs. The rest (the model's metadata cache, the arena, slots
held for a late reply, cancel on timeout, registering regions again after a broker restart) is the client's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from zinfer.client import AsyncClient, dtypes, protocol
from zinfer.client.arena import Slot
from zinfer.client.async_connection import AsyncConnection
from zinfer.client.base import _ModelInfo, _Prepared
from zinfer.client.errors import ProtocolError, RequestTimeout, Status, from_status
from zinfer.client.protocol import (
    TRACE_ID,
    CancelCommand,
    Command,
    Frame,
    InferRequest,
    OutputRequest,
    Reply,
    ShmRef,
    TensorRef,
)
from zinfer.client.request_parameters import sequence_parameters, user_parameters

from .bridge_records import InferCall, InferReply, Tensor, array_bytes
from .http_raw import RawPlan

__all__ = ["DoorClient", "WireBytes", "with_wire", "wire_bytes"]


class DoorClient(AsyncClient):
    async def infer_call(
        self, call: InferCall, version: int, parameters: Mapping[str, Any] | None, wait: float
    ) -> InferReply:
        """Run ``call`` (its model's ``version``, 0 the newest) with ``parameters`` (the model's, and the
        trace context); ``wait`` bounds the wait for the reply."""
        info = self._cached_info(call.model, version) or await self._model_info(call.model, version)
        p = self._prepare_call(info, call, parameters)
        try:
            if self._unregistered:  # a new arena segment the broker must learn of first
                await self._register_new()
            reply, rframes = await self._exchange(p, wait)
            if self._unknown_region(reply):
                await self._register_all()
                reply, rframes = await self._exchange(p, wait)
        except BaseException as exc:
            self._abandon(p, exc)
            raise
        return self._reply_of(p, reply, rframes, call.request_id)

    def raw_plan(
        self, call: InferCall, version: int, parameters: Mapping[str, Any] | None, wait: float
    ) -> RawPlan | None:
        """The direct path's plan for requests like ``call`` (``http_raw``), which went the usual way just
        now: the wire request ``infer_call`` builds for it and the model information it holds for; a plan
        that does not go direct (``direct`` False) where an input or output takes an arena slot. None when
        the model's information is not held now (a later request asks again)."""
        info = self._cached_info(call.model, version)
        if info is None or call.request_id:
            return None
        p = self._prepare_call(info, call, parameters)
        direct = not p.slots and not p.keep and len(p.frames) == len(call.inputs)
        self._free(p.slots)
        sizes = tuple([memoryview(f).nbytes for f in p.frames]) if direct else ()
        return RawPlan((call.model, version), info, p.header, sizes, wait, direct)

    def holds(self, plan: RawPlan) -> bool:
        """Whether ``plan`` was made with the model information held now (not before a reload)."""
        return self._models.get(plan.key) is plan.info

    async def infer_raw(self, plan: RawPlan, frames: list[Frame]) -> tuple[Reply, list[Frame]] | None:
        """Send ``plan``'s wire request with ``frames`` as its inputs; its reply and frames. None (nothing
        sent) when the model's information changed since the plan was made. A request that times out or
        whose caller gives up is cancelled in the broker, as ``infer_call``'s."""
        if not plan.direct or self._models.get(plan.key) is not plan.info:
            return None
        conn = self._conn
        rid = conn.new_id()
        fut = conn.send(Command.INFER, msgspec.structs.replace(plan.header, request_id=rid), frames)
        try:
            return await conn.wait(rid, fut, plan.wait)
        except (RequestTimeout, asyncio.CancelledError):
            conn.send_only(Command.CANCEL, protocol.cancel_command_to_wire(CancelCommand(rid)))
            raise

    @property
    def connection(self) -> AsyncConnection:
        """The connection to the broker (one for the client's life)."""
        return self._conn

    def read_raw(self, plan: RawPlan, reply: Reply, frames: list[Frame]) -> InferReply:
        """A reply to ``infer_raw`` read the usual way (``infer_call``'s reading)."""
        return self._reply_of(_Prepared(plan.header, [], [], {}, ""), reply, frames, "")

    def _prepare_call(
        self, info: _ModelInfo, call: InferCall, parameters: Mapping[str, Any] | None
    ) -> _Prepared:
        slots: list[Slot] = []
        frames: list[Frame] = []
        keep: list[Any] = []
        refs: list[TensorRef] = []
        out_slots: dict[str, Slot] = {}
        outputs: list[OutputRequest] = []
        use_shm = self._use_shm
        try:
            batch, input_bytes = 1, 0
            for i, t in enumerate(call.inputs):
                arr = t.data
                if i == 0 and t.shape:
                    batch = t.shape[0]
                in_arena = use_shm and self._owned and t.datatype != dtypes.BYTES
                owned = self._owned_ref(arr) if in_arena else None
                if owned is not None:  # read into the arena by the door (shared memory): sent where it is
                    refs.append(TensorRef(t.name, t.datatype, t.shape, owned))
                    keep.append(arr)
                    input_bytes += owned.nbytes
                    continue
                data = _raw(t)
                nbytes = data.nbytes
                if use_shm and nbytes > self.inline_threshold:
                    slot = self._arena_get().alloc(nbytes)
                    slots.append(slot)
                    np.frombuffer(slot.view(), dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
                    where = ShmRef(slot.region, slot.offset, nbytes)
                    refs.append(TensorRef(t.name, t.datatype, t.shape, where))
                    input_bytes += nbytes
                else:
                    frames.append(data)
                    refs.append(TensorRef(t.name, t.datatype, t.shape, None, len(frames) - 1))
            names = call.outputs
            wanted = info.outputs if not names else tuple(self._output_spec(info, n) for n in names)
            # an output may be named inside an input (no copy in the worker) when every input in shared
            # memory is an array of the door's own, which the reply's tensors keep (``_reply_of``)
            alias = bool(keep) and not slots
            for spec in wanted:
                size = self._output_capacity(spec, batch, info, input_bytes) if use_shm else None
                if size is None or size <= self.inline_threshold:
                    outputs.append(OutputRequest(spec.name))
                    continue
                slot = self._arena_get().alloc(size)
                slots.append(slot)
                out_slots[spec.name] = slot
                outputs.append(OutputRequest(spec.name, ShmRef(slot.region, slot.offset, size), alias))
        except BaseException:
            self._free(slots)
            raise
        sequence = sequence_parameters(call.sequence_id, call.sequence_start, call.sequence_end)
        params = {**user_parameters(parameters), **sequence} or protocol.NO_PARAMETERS  # none: none sent
        request = InferRequest(
            "", info.name, info.version, tuple(refs), tuple(outputs), call.priority, call.timeout_us,
            params, call.request_id,
        )  # fmt: skip
        return _Prepared(request, frames, slots, out_slots, call.request_id, keep=keep)

    def _reply_of(self, p: _Prepared, reply: Reply, frames: list[Frame], request_id: str) -> InferReply:
        """The reply's outputs as tensors over its frames and slots; frees the input slots."""
        outs = p.out_slots
        if reply.status != Status.OK:
            self._free(p.slots)
            raise from_status(reply.status, reply.error)
        used: set[str] = set()
        body = reply.body
        try:
            if not isinstance(body, dict):
                raise ProtocolError("malformed infer reply")
            tensors = []
            aliases = _aliases(p) if p.keep else ()
            for d in body.get("outputs", []):
                ref = protocol.tensor_from_wire(d)
                data = self._output_array(ref, frames, outs, used, aliases)
                if ref.datatype == dtypes.BYTES and ref.frame is not None:  # sent on as the broker wrote it
                    data = with_wire(data, bytes(frames[ref.frame]))
                tensors.append(Tensor(ref.name, ref.datatype, ref.shape, data))
        finally:  # the input slots, and the output slots no array holds (an array frees its own)
            if p.slots:
                out_ids = {id(s) for s in outs.values()}
                unused = [s for n, s in outs.items() if n not in used]
                self._free([s for s in p.slots if id(s) not in out_ids] + unused)
        params = body.get("parameters")
        params = dict(params) if isinstance(params, dict) else {}
        trace = params.pop(TRACE_ID, "") if params else ""  # the broker traced it: the door adds its stamps
        return InferReply(
            str(body.get("model", "")), str(body.get("version", 0)), request_id, tuple(tensors), True,
            params, str(trace),
        )  # fmt: skip


def _aliases(p: _Prepared) -> list[tuple[ShmRef, npt.NDArray[Any]]]:
    """The inputs an output of ``p``'s reply may be named in: each of the door's own arrays the request
    sent where it is, with its range (none unless the request let outputs alias, ``_prepare_call``)."""
    if not any(o.alias for o in p.header.outputs or ()):
        return []
    refs = [t.shm for t in p.header.inputs if t.shm is not None]  # every one of them is in ``keep``
    return list(zip(refs, p.keep, strict=True)) if len(refs) == len(p.keep) else []


def _raw(t: Tensor) -> memoryview:
    """A tensor's bytes as the wire carries them (BYTES: Triton's length-prefixed items)."""
    if t.datatype == dtypes.BYTES:
        return memoryview(wire_bytes(t.data))
    return array_bytes(t.data)


class WireBytes(np.ndarray[Any, np.dtype[np.object_]]):
    """A ``BYTES`` tensor's object array that keeps the wire form it was read from (Triton's length-prefixed
    items): the door passes those bytes on (to the broker, into a response) instead of encoding the items
    again. Only the array ``with_wire`` made holds them; a view of it (a reshape, a slice) encodes anew."""

    wire: bytes | None = None


def with_wire(items: npt.NDArray[Any], wire: bytes) -> npt.NDArray[Any]:
    """``items`` (decoded from ``wire``, whole) as a ``WireBytes`` that remembers ``wire``."""
    arr = items.view(WireBytes)
    arr.wire = wire
    return arr


def wire_bytes(data: npt.NDArray[Any]) -> bytes:
    """A ``BYTES`` tensor's wire form: the one it was read from, or its items encoded."""
    wire = data.wire if type(data) is WireBytes else None
    return wire if wire is not None else dtypes.serialize_bytes(data)
