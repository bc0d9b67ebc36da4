"""The floor relay's processes and client loops (``floor_relay.py`` runs them): zinfer's three processes
with the bare relay's sockets, frames and poll set, plus only the per-message work zinfer's wire contract
cannot avoid, in plain Python on the real records and encoders (``zinfer.client.protocol``,
``worker_protocol``, ``wire_records``, ``worker_records``).

Levels (``LEVELS``):

* ``codec``: every message is a real one, encoded and decoded as zinfer's peers do: the client encodes an
  INFER of ``add0`` (two [1,1] FP32 inputs inline, packed into one blob as the client packs them); the
  broker reads it into its record (``decode_infer``), looks the model up in a dict, picks its worker, keeps
  the request by number and encodes an EXECUTE (``encode_execute``); the worker reads it
  (``decode_execute``) and answers a RESULT record with timings; the broker reads it (``decode_result``),
  finds the request and encodes the REPLY (``protocol.encode``); the client reads the REPLY into its record.
  No arrays: the worker answers with its first input's bytes, the client keeps the output frame as it is.
* ``numpy``: ``codec`` plus the array work: the client sends its arrays' bytes and makes the output array
  from the reply's frame; the worker makes the input arrays from the frames, adds them, and sends the sum's
  bytes.
* ``packed`` (c1 only): ``numpy``'s messages and array work with the same facts in each header (request id,
  model, each tensor's name, datatype, shape and frame, the batch, the status, the timings), packed with
  ``struct`` in fixed binary layouts instead of zinfer's MessagePack records: what a cheaper codec than the
  records could at best take off the floor. Each message is parsed and checked field by field as the
  records are (a wrong version, command or model is refused).

The broker batches as zinfer's does for a model with ``max_queue_delay_microseconds: 0``: one batch in
flight per worker; what arrives while it runs goes, up to ``MAX_BATCH``, in the next EXECUTE (at
concurrency 1 every batch is one request); it keeps the counts and durations of Triton's statistics
extension. A client that sends a BUNDLE gets its replies of one turn as one BUNDLE (as zinfer's outbox
sends them); ``FloorClient.requests`` sends a BUNDLE as the AsyncClient sends a loop turn's requests. Other
statistics, metrics, deadlines, priorities, cancellation, shared memory, tracing, heartbeats and every
check beyond the records' own are left out: that is what zinfer adds on top of this floor.

One difference in the ZeroMQ calls: the floor receives frames as bytes (``copy=True``), where the bare
forwarder takes ``zmq.Frame`` objects; for frames this small bytes are the cheaper of the two, and the
decoders read bytes.

Usage (by ``floor_relay.py``, which imports this module and runs ``main``, compiled by mypyc or not):
``python -c "import floor_procs; floor_procs.main()" broker|worker LEVEL ENDPOINT...``.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from collections import deque
from typing import Any

import numpy as np
import zmq

from zinfer.client import protocol
from zinfer.client.protocol import Command, InferRequest, OutputRequest, Reply, TensorRef
from zinfer.client.worker_protocol import decode_execute, decode_result, encode_execute
from zinfer.client.worker_records import Execute, ExecuteRequest, RequestResult, WorkerResult

LEVELS = ("codec", "numpy", "packed")
MODEL = "add0"
MAX_BATCH = 64
DTYPES = {"FP32": np.dtype(np.float32)}
_REPLY_HEAD = protocol.PROTOCOL + bytes([Command.REPLY])
_decode_reply = protocol.typed_decoders(Reply)[0]


class _Model:
    """What the broker knows of a model: its name, version, outputs, worker and queue."""

    def __init__(self, name: str, worker: bytes) -> None:
        self.name, self.version, self.worker = name, 1, worker
        self.outputs = (OutputRequest("OUTPUT_SUM"),)
        self.busy = False
        self.queue: deque[tuple[bytes, InferRequest, list[Any], int]] = deque()
        # Triton's statistics extension: counts and cumulative durations (ns) per model
        self.success = self.executions = self.queue_ns = self.compute_ns = 0


Sock = zmq.Socket[bytes]


def _broker_sockets(front_ep: str, back_ep: str) -> tuple[Sock, Sock, bytes, zmq.Poller]:
    """The bare forwarder's sockets and poll set: clients' ROUTER, workers' ROUTER, the worker's identity (it
    says hello first)."""
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.bind(front_ep)
    back = ctx.socket(zmq.ROUTER)
    back.bind(back_ep)
    worker_id = back.recv_multipart()[0]
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    return front, back, worker_id, poller


def _worker_socket(back_ep: str) -> Sock:
    """The echo worker's DEALER, connected, its hello sent."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(back_ep)
    sock.send(b"hello")
    return sock


def broker(front_ep: str, back_ep: str) -> None:
    """The floor broker: the bare forwarder's sockets and poll set, with zinfer's per-message work."""
    front, back, worker_id, poller = _broker_sockets(front_ep, back_ep)
    models = {MODEL: _Model(MODEL, worker_id)}
    by_worker = {worker_id: models[MODEL]}
    in_flight: dict[int, tuple[_Model, list[tuple[bytes, str]]]] = {}
    batch_ids = iter(range(1, 1 << 62))
    bundling: set[bytes] = set()  # clients that sent a BUNDLE
    held: dict[bytes, list[tuple[Command, dict[str, Any], list[Any]]]] = {}

    def dispatch(m: _Model) -> None:
        items = [m.queue.popleft() for _ in range(min(MAX_BATCH, len(m.queue)))]
        requests: list[ExecuteRequest] = []
        frames: list[Any] = []
        waiting: list[tuple[bytes, str]] = []
        now = time.monotonic_ns()
        for seq, (client, req, inline, arrived) in enumerate(items):
            m.queue_ns += now - arrived
            inputs = req.inputs
            if frames:  # inline frames are numbered across the batch
                inputs = tuple(TensorRef(t.name, t.datatype, t.shape, None, len(frames) + _frame(t))
                               for t in inputs)  # fmt: skip
            frames.extend(inline)
            outputs = m.outputs if req.outputs is None else req.outputs
            requests.append(ExecuteRequest(seq, inputs, outputs, req.caller_id))
            waiting.append((client, req.request_id))
        batch = next(batch_ids)
        in_flight[batch] = (m, waiting)
        m.busy = True
        back.send_multipart([m.worker, *encode_execute(Execute(batch, tuple(requests)), frames)])

    while True:
        events = dict(poller.poll(1000))
        if front in events:
            while True:
                try:
                    client, *msg = front.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if protocol.is_bundle(msg):  # several INFERs in one message: replies go bundled too
                    bundling.add(client)
                    for entry in protocol.decode_many(msg, protocol.CLIENT_COMMANDS):
                        req = protocol.infer_from_wire(entry.header)
                        models[req.model].queue.append((client, req, entry.frames, time.monotonic_ns()))
                    continue
                infer = protocol.decode_infer(msg)
                if infer is None:
                    raise SystemExit("the floor takes only well-formed INFERs")
                req = infer.record
                models[req.model].queue.append((client, req, infer.frames, time.monotonic_ns()))
        if back in events:
            while True:
                try:
                    worker, *msg = back.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = decode_result(msg)
                if got is None:
                    raise SystemExit("the floor takes only well-formed RESULTs")
                result: WorkerResult = got.record
                m, waiting = in_flight.pop(result.batch)
                by_worker[worker].busy = False
                m.executions += 1
                m.success += len(result.results)
                m.compute_ns += sum(result.timings)
                for res in result.results:
                    client, rid = waiting[res.id]
                    outs, out_frames = [], []
                    for t in res.outputs:  # the client's frames are numbered from 0 for each reply
                        if t.frame is not None:
                            out_frames.append(got.frames[t.frame])
                            if t.frame != len(out_frames) - 1:
                                t = TensorRef(t.name, t.datatype, t.shape, None, len(out_frames) - 1)
                        outs.append(t)
                    header = {"id": rid, "status": 0,
                              "body": {"model": m.name, "version": m.version, "outputs": outs}}  # fmt: skip
                    if client in bundling:
                        held.setdefault(client, []).append((Command.REPLY, header, out_frames))
                    else:
                        front.send_multipart([client, *protocol.encode(Command.REPLY, header, out_frames)])
            for client, replies in held.items():  # a turn's replies to a bundling client: one message
                if len(replies) == 1:
                    front.send_multipart([client, *protocol.encode(*replies[0])])
                else:
                    for i in range(0, len(replies), protocol.MAX_BUNDLE):
                        chunk = replies[i : i + protocol.MAX_BUNDLE]
                        front.send_multipart([client, *protocol.encode_bundle(chunk)])
            held.clear()
        for m in models.values():  # a worker that is free takes what waits
            if m.queue and not m.busy:
                dispatch(m)


def _frame(t: TensorRef) -> int:
    """An inline tensor's frame number (the floor takes no shared memory)."""
    if t.frame is None:
        raise SystemExit("the floor takes only inline tensors")
    return t.frame


def _array(t: TensorRef, frames: list[Any]) -> Any:
    """The array an inline input's frame holds."""
    return np.frombuffer(frames[_frame(t)], DTYPES[t.datatype]).reshape(t.shape)


def worker(back_ep: str, arrays: bool) -> None:
    """The floor worker: the echo worker's socket and calls, reading EXECUTE and answering RESULT."""
    sock = _worker_socket(back_ep)
    ns = time.monotonic_ns
    while True:
        if not sock.poll(10_000):
            return
        msg = sock.recv_multipart()
        got = decode_execute(msg)
        if got is None:
            return
        ex: Execute = got.record
        frames = got.frames
        t0 = ns()
        reqs = ex.requests
        if arrays:
            a = [_array(r.inputs[0], frames) for r in reqs]
            b = [_array(r.inputs[1], frames) for r in reqs]
            xa, xb = (a[0], b[0]) if len(reqs) == 1 else (np.concatenate(a), np.concatenate(b))
            t1 = ns()
            total = xa + xb
            t2 = ns()
            out_frames: list[Any] = [total.tobytes()] if len(reqs) == 1 else [
                total[i : i + 1].tobytes() for i in range(len(reqs))
            ]  # fmt: skip
        else:
            t1 = t2 = ns()
            out_frames = [frames[_frame(r.inputs[0])] for r in reqs]
        results = tuple(
            RequestResult(r.id, outputs=(TensorRef(r.outputs[0].name, "FP32", (1, 1), None, i),))
            for i, r in enumerate(reqs)
        )
        t3 = ns()
        result = WorkerResult(ex.batch, results, timings=(t1 - t0, t2 - t1, t3 - t2))
        header: Any = result  # encoded as it is: the map ``result_to_wire`` writes
        sock.send_multipart(protocol.encode(Command.W_RESULT, header, out_frames))


# ------------------------------------------------------------------------------ the packed level (c1)

# head of every packed message: version, command, a 64-bit number (request or batch), a 16-bit count
_HEAD = struct.Struct("<BBQH")
_TENSOR = struct.Struct("<BBBI")  # name length, datatype code, dims, frame
_DIM = struct.Struct("<q")
_TIMINGS = struct.Struct("<qqq")
_U16 = struct.Struct("<H")
_P_VERSION = 1
_P_INFER, _P_EXECUTE, _P_RESULT, _P_REPLY = 1, 2, 3, 4
_P_DTYPES = ("FP32",)
_P_CODES = {"FP32": 0}
PTensor = tuple[str, str, tuple[int, ...], int]  # name, datatype, shape, frame


def _pack_tensors(ts: list[PTensor]) -> bytes:
    parts = [bytes([len(ts)])]
    for name, dtype, shape, frame in ts:
        raw = name.encode()
        parts.append(_TENSOR.pack(len(raw), _P_CODES[dtype], len(shape), frame))
        parts.append(raw)
        parts.extend(_DIM.pack(d) for d in shape)
    return b"".join(parts)


def _unpack_tensors(buf: bytes, off: int, frames: int) -> tuple[list[PTensor], int]:
    n = buf[off]
    off += 1
    out: list[PTensor] = []
    for _ in range(n):
        ln, code, ndim, frame = _TENSOR.unpack_from(buf, off)
        off += _TENSOR.size
        name = buf[off : off + ln].decode()
        off += ln
        shape = tuple(_DIM.unpack_from(buf, off + 8 * i)[0] for i in range(ndim))
        off += 8 * ndim
        if code >= len(_P_DTYPES) or frame >= frames or any(d < 0 for d in shape):
            raise ValueError("a bad tensor")
        out.append((name, _P_DTYPES[code], shape, frame))
    return out, off


def _head(buf: bytes, command: int) -> tuple[int, int, int]:
    version, cmd, number, count = _HEAD.unpack_from(buf, 0)
    if version != _P_VERSION or cmd != command:
        raise ValueError(f"not a packed message of command {command}")
    return number, count, _HEAD.size


def packed_broker(front_ep: str, back_ep: str) -> None:
    """``broker`` with packed messages at c1 (no BUNDLEs): the same sockets, poll set, batch, statistics."""
    front, back, worker_id, poller = _broker_sockets(front_ep, back_ep)
    models = {MODEL: _Model(MODEL, worker_id)}
    by_worker = {worker_id: models[MODEL]}
    pqueue: deque[tuple[bytes, int, list[PTensor], list[Any], int]] = deque()
    in_flight: dict[int, tuple[_Model, list[tuple[bytes, int]]]] = {}
    batch_ids = iter(range(1, 1 << 62))
    outputs: list[PTensor] = [("OUTPUT_SUM", "FP32", (), 0)]
    model_raw = MODEL.encode()
    while True:
        events = dict(poller.poll(1000))
        if front in events:
            while True:
                try:
                    client, head, *frames = front.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                rid, ln, off = _head(head, _P_INFER)
                if head[off : off + ln].decode() not in models:
                    raise SystemExit("the floor takes only INFERs of its model")
                inputs, off = _unpack_tensors(head, off + ln, len(frames))
                pqueue.append((client, rid, inputs, frames, time.monotonic_ns()))
        if back in events:
            while True:
                try:
                    worker, head, *frames = back.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                batch, count, off = _head(head, _P_RESULT)
                m, waiting = in_flight.pop(batch)
                by_worker[worker].busy = False
                m.executions += 1
                m.success += count
                for _ in range(count):
                    (seq,) = _U16.unpack_from(head, off)
                    outs, off = _unpack_tensors(head, off + 2, len(frames))
                    client, rid = waiting[seq]
                    reply_frames = [frames[t[3]] for t in outs]
                    renumbered = [(t[0], t[1], t[2], i) for i, t in enumerate(outs)]
                    reply = b"".join((_HEAD.pack(_P_VERSION, _P_REPLY, rid, 0), _U16.pack(len(model_raw)),
                                      model_raw, _pack_tensors(renumbered)))  # fmt: skip
                    front.send_multipart([client, reply, *reply_frames])
                m.compute_ns += sum(_TIMINGS.unpack_from(head, off))
        m = models[MODEL]
        if pqueue and not m.busy:
            items = [pqueue.popleft() for _ in range(min(MAX_BATCH, len(pqueue)))]
            parts: list[bytes] = []
            out_frames: list[Any] = []
            sent: list[tuple[bytes, int]] = []
            now = time.monotonic_ns()
            for seq, (client, rid, inputs, inline, arrived) in enumerate(items):
                m.queue_ns += now - arrived
                base = len(out_frames)
                moved = [(t[0], t[1], t[2], base + t[3]) for t in inputs]
                out_frames.extend(inline)
                parts += [_U16.pack(seq), _pack_tensors(moved), _pack_tensors(outputs)]
                sent.append((client, rid))
            batch = next(batch_ids)
            in_flight[batch] = (m, sent)
            m.busy = True
            head = _HEAD.pack(_P_VERSION, _P_EXECUTE, batch, len(items)) + b"".join(parts)
            back.send_multipart([m.worker, head, *out_frames])


def packed_worker(back_ep: str) -> None:
    """``worker`` with packed messages: the arrays from their frames, the sum, a packed RESULT."""
    sock = _worker_socket(back_ep)
    ns = time.monotonic_ns
    while True:
        if not sock.poll(10_000):
            return
        head, *frames = sock.recv_multipart()
        batch, count, off = _head(head, _P_EXECUTE)
        t0 = ns()
        a: list[Any] = []
        b: list[Any] = []
        seqs: list[int] = []
        names: list[str] = []
        for _ in range(count):
            (seq,) = _U16.unpack_from(head, off)
            inputs, off = _unpack_tensors(head, off + 2, len(frames))
            outs, off = _unpack_tensors(head, off, len(frames))
            seqs.append(seq)
            names.append(outs[0][0])
            for t, into in zip(inputs, (a, b), strict=True):
                into.append(np.frombuffer(frames[t[3]], DTYPES[t[1]]).reshape(t[2]))
        xa, xb = (a[0], b[0]) if count == 1 else (np.concatenate(a), np.concatenate(b))
        t1 = ns()
        total = xa + xb
        t2 = ns()
        out_frames: list[Any] = [total.tobytes()] if count == 1 else [
            total[i : i + 1].tobytes() for i in range(count)
        ]  # fmt: skip
        parts = [_HEAD.pack(_P_VERSION, _P_RESULT, batch, count)]
        for i, (seq, name) in enumerate(zip(seqs, names, strict=True)):
            parts += [_U16.pack(seq), _pack_tensors([(name, "FP32", (1, 1), i)])]
        t3 = ns()
        parts.append(_TIMINGS.pack(t1 - t0, t2 - t1, t3 - t2))
        sock.send_multipart([b"".join(parts), *out_frames])


class PackedClient:
    """``FloorClient`` with packed messages, at c1: an INFER from arrays, a REPLY into an array."""

    def __init__(self) -> None:
        self._n = 0
        self._waiting: set[int] = set()
        self._a = np.ones((1, 1), np.float32)
        self._b = np.full((1, 1), 2.0, np.float32)
        self._expected = np.full((1, 1), 3.0, np.float32)
        self._model = MODEL.encode()

    def request(self) -> tuple[int, list[Any]]:
        self._n += 1
        rid = self._n
        self._waiting.add(rid)
        named = (("INPUT_A", self._a), ("INPUT_B", self._b))
        ts: list[PTensor] = [(name, "FP32", tuple(x.shape), i) for i, (name, x) in enumerate(named)]
        head = b"".join((_HEAD.pack(_P_VERSION, _P_INFER, rid, len(self._model)), self._model,
                         _pack_tensors(ts)))  # fmt: skip
        return rid, [head, *(x.tobytes() for _, x in named)]

    def reply(self, frames: list[bytes]) -> tuple[int, Any]:
        head = frames[0]
        rid, status, off = _head(head, _P_REPLY)  # a REPLY's count field is its status
        (ln,) = _U16.unpack_from(head, off)
        if head[off + 2 : off + 2 + ln] != self._model:
            raise RuntimeError("a reply from another model")
        outs, _ = _unpack_tensors(head, off + 2 + ln, len(frames) - 1)
        try:
            self._waiting.remove(rid)
        except KeyError:
            raise RuntimeError(f"a reply to no request: {rid!r}") from None
        if status != 0:
            raise RuntimeError(f"an error reply: status {status}")
        name, dtype, shape, frame = outs[0]
        return rid, np.frombuffer(frames[1 + frame], DTYPES[dtype]).reshape(shape)

    def replies(self, frames: list[bytes]) -> int:
        self.reply(frames)
        return 1

    def right(self, rid: int, frames: list[bytes]) -> bool:
        got_id, value = self.reply(frames)
        return bool(got_id == rid and value.shape == (1, 1) and np.array_equal(value, self._expected))


# ------------------------------------------------------------------------------------------ client side


class FloorClient:
    """The client's per-request work: an INFER from arrays (or bytes), a REPLY into arrays (or frames)."""

    def __init__(self, arrays: bool) -> None:
        self.arrays = arrays
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        self._n = 0
        self._waiting: set[str] = set()  # ids sent and not answered: each reply is matched to its request
        self._outputs = (OutputRequest("OUTPUT_SUM"),)
        self._a = np.ones((1, 1), np.float32)
        self._b = np.full((1, 1), 2.0, np.float32)
        self._raw = [self._a.tobytes(), self._b.tobytes()]
        self._expected: Any = np.full((1, 1), 3.0, np.float32) if arrays else self._raw[0]

    def _one(self) -> tuple[str, InferRequest, list[Any]]:
        self._n += 1
        rid = f"{self._prefix}{self._n}"
        self._waiting.add(rid)
        if self.arrays:
            named = (("INPUT_A", self._a), ("INPUT_B", self._b))
            inputs = tuple(TensorRef(name, "FP32", x.shape, None, i) for i, (name, x) in enumerate(named))
            payload = [x.tobytes() for _, x in named]
        else:
            inputs = (
                TensorRef("INPUT_A", "FP32", (1, 1), None, 0),
                TensorRef("INPUT_B", "FP32", (1, 1), None, 1),
            )
            payload = self._raw
        return rid, InferRequest(rid, MODEL, 0, inputs, self._outputs, caller_id=""), payload

    def request(self) -> tuple[str, list[Any]]:
        """One INFER: its id and frames."""
        rid, req, payload = self._one()
        return rid, protocol.encode(Command.INFER, req, payload)

    def requests(self, k: int) -> list[Any]:
        """``k`` INFERs as one message (a BUNDLE when several, as the AsyncClient sends a loop turn's)."""
        if k == 1:
            return self.request()[1]
        items = []
        for _ in range(k):
            _, req, payload = self._one()
            items.append((Command.INFER, req, payload))
        return protocol.encode_bundle(items)

    def reply(self, frames: list[bytes]) -> Any:
        """A lone REPLY: its id and its output (an array, or the frame as it came)."""
        env = frames[0]
        if env[:5] != _REPLY_HEAD:
            raise RuntimeError("not a lone REPLY")
        reply: Reply = _decode_reply(memoryview(env)[protocol.ENVELOPE_HEAD - 1 :])
        return reply.request_id, self._output(reply, frames[1:])

    def _output(self, reply: Reply, frames: list[Any]) -> Any:
        try:
            self._waiting.remove(reply.request_id)
        except KeyError:
            raise RuntimeError(f"a reply to no request: {reply.request_id!r}") from None
        if reply.status != 0:
            raise RuntimeError(reply.error)
        out = reply.body["outputs"][0]
        data = frames[out["frame"]]
        if not self.arrays:
            return data
        return np.frombuffer(data, DTYPES[out["datatype"]]).reshape(out["shape"])

    def replies(self, frames: list[bytes]) -> int:
        """The replies of one message (a REPLY or a BUNDLE of them), each made into its output; how many."""
        if frames[0][:5] == _REPLY_HEAD:
            self.reply(frames)
            return 1
        got = protocol.decode_replies(frames)
        for reply, inline in got:
            self._output(reply, inline)
        return len(got)

    def right(self, rid: str, frames: list[bytes]) -> bool:
        """Whether ``frames`` are the answer to request ``rid``: its id, and the sum (or the echoed input)."""
        got_id, value = self.reply(frames)
        if self.arrays:
            return bool(got_id == rid and value.shape == (1, 1) and np.array_equal(value, self._expected))
        return bool(got_id == rid and bytes(value) == self._expected)


def main() -> None:
    role, level, *eps = sys.argv[1:]
    if level not in LEVELS:
        raise SystemExit(f"level must be one of {LEVELS}")
    if role == "broker":
        packed_broker(eps[0], eps[1]) if level == "packed" else broker(eps[0], eps[1])
    elif role == "worker":
        packed_worker(eps[0]) if level == "packed" else worker(eps[0], level == "numpy")
    else:
        raise SystemExit("role must be broker or worker")


if __name__ == "__main__":
    main()
