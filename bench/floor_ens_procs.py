"""The c32 floor's broker and client (``floor_ensemble.py`` runs them; the worker is ``floor_pb``): the bare
relay's sockets and poll set, zinfer's real records and encoders, the models of ``vs_triton_repo`` with
their own ``model.py`` code, and only the per-message work zinfer's contract cannot avoid.

Models (``SPECS``): ``add`` (batched, max 64, one instance) and the three steps of ``text_ensemble``:
``tokenizer`` and ``detokenizer`` (no dynamic batching: what queues goes as a ``serial`` run, each request
its own ``execute``), ``lm`` (batched, max 16), two instances each. A client asks for ``add`` or
``text_ensemble`` (``PLANS``): each is a plan of steps; the broker keeps one request's state between
steps in a dict (its client, id, plan and step) and nothing else, and moves a step's output frame as it
came into the next step's EXECUTE under the next step's input name.

The broker batches as ``floor_procs`` does (delay 0: one batch in flight per instance; what arrives while
all instances are busy goes, up to the model's maximum, to the next free one), keeps Triton's statistics
counts per model, and answers a client that sent a BUNDLE with one BUNDLE per turn. Every check beyond
the records' own, deadlines, priorities, cancellation, shared memory, metrics, tracing, heartbeats, and
the batcher's delay are left out: that is what zinfer adds on top of this floor.

Usage (by ``floor_ensemble.py``): ``python -c "import floor_ens_procs; floor_ens_procs.main()"
broker FRONT BACK [--one] MODEL...`` | ``worker BACK MODEL MODEL_PY`` (``--one``: no serial runs, one
request per EXECUTE for a model without dynamic batching).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import deque
from typing import Any

import floor_pb
import floor_procs
import numpy as np
import zmq

from zinfer.client import dtypes, protocol
from zinfer.client.protocol import Command, InferRequest, OutputRequest, Reply, TensorRef
from zinfer.client.worker_protocol import decode_result, encode_execute
from zinfer.client.worker_records import Execute, ExecuteRequest, WorkerResult

# model: (max batch, batched (else serial runs), instances, its output)
SPECS: dict[str, tuple[int, bool, int, str]] = {
    "add": (64, True, 1, "OUTPUT_SUM"),
    "tokenizer": (16, False, 2, "TOKENS"),
    "lm": (16, True, 2, "TOKENS_OUT"),
    "detokenizer": (16, False, 2, "TEXT"),
}
# what a client asks for: its steps, each (model, the input name it takes from the step before (None: the
# client's own inputs), the name its output has in the reply (None: its own))
Plan = tuple[tuple[str, str | None, str | None], ...]
PLANS: dict[str, Plan] = {
    "add": (("add", None, None),),
    "text_ensemble": (("tokenizer", None, None), ("lm", "TOKENS", None), ("detokenizer", "TOKENS", "RESULT")),
}
Item = tuple[int, tuple[TensorRef, ...], list[Any], int]  # job, inputs, their frames, arrival (ns)


class _Model:
    """What the broker knows of a model: its spec, its free instances and its queue."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.max_batch, self.batched, self.instances, output = SPECS[name]
        self.outputs = (OutputRequest(output),)
        self.free: list[bytes] = []
        self.queue: deque[Item] = deque()
        # Triton's statistics extension: counts and cumulative durations (ns) per model
        self.success = self.executions = self.queue_ns = self.compute_ns = 0
        self.messages = 0  # EXECUTEs sent (a serial run is one message, one execution per request)


class _Job:
    """One client request's state between its steps."""

    def __init__(self, client: bytes, rid: str, model: str, plan: Plan) -> None:
        self.client, self.rid, self.model, self.plan, self.step = client, rid, model, plan, 0


def broker(front_ep: str, back_ep: str, names: list[str], runs: bool = True) -> None:
    """The floor broker of ``names`` (models); waits for every instance's hello, then serves. ``runs``:
    a model without dynamic batching takes what waits as a serial run (as zinfer's broker sends it); else
    one request per EXECUTE (as Triton's default scheduler gives an instance one request at a time)."""
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.bind(front_ep)
    back = ctx.socket(zmq.ROUTER)
    back.bind(back_ep)
    models = {n: _Model(n) for n in names}
    for _ in range(sum(m.instances for m in models.values())):  # each instance says hello with its model
        wid, hello = back.recv_multipart()
        models[hello.decode()].free.append(wid)
    jobs: dict[int, _Job] = {}
    job_ids = iter(range(1, 1 << 62))
    in_flight: dict[int, tuple[_Model, bytes, list[int]]] = {}
    batch_ids = iter(range(1, 1 << 62))
    bundling: set[bytes] = set()  # clients that sent a BUNDLE
    held: dict[bytes, list[tuple[Command, dict[str, Any], list[Any]]]] = {}
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)

    def counts(signum: int, frame: Any) -> None:
        """SIGUSR1: the statistics counts so far, as JSON, into the file ``FLOOR_STATS`` names."""
        doc = {m.name: {"inference_count": m.success, "execution_count": m.executions, "messages": m.messages}
               for m in models.values()}  # fmt: skip
        path = os.environ["FLOOR_STATS"]
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)

    if "FLOOR_STATS" in os.environ:
        signal.signal(signal.SIGUSR1, counts)

    def take(client: bytes, req: InferRequest, frames: list[Any]) -> None:
        plan = PLANS[req.model]
        job = next(job_ids)
        jobs[job] = _Job(client, req.request_id, req.model, plan)
        models[plan[0][0]].queue.append((job, req.inputs, frames, time.monotonic_ns()))

    def dispatch(m: _Model) -> None:
        most = m.max_batch if m.batched or runs else 1
        items = [m.queue.popleft() for _ in range(min(most, len(m.queue)))]
        requests: list[ExecuteRequest] = []
        frames: list[Any] = []
        waiting: list[int] = []
        now = time.monotonic_ns()
        for seq, (job, inputs, inline, arrived) in enumerate(items):
            m.queue_ns += now - arrived
            if frames:  # inline frames are numbered across the batch
                k = len(frames)
                inputs = tuple(
                    TensorRef(t.name, t.datatype, t.shape, None, k + floor_procs._frame(t)) for t in inputs
                )
            frames.extend(inline)
            requests.append(ExecuteRequest(seq, inputs, m.outputs, jobs[job].rid))
            waiting.append(job)
        worker = m.free.pop()
        batch = next(batch_ids)
        in_flight[batch] = (m, worker, waiting)
        m.messages += 1
        ex = Execute(batch, tuple(requests), serial=not m.batched and len(requests) > 1)
        back.send_multipart([worker, *encode_execute(ex, frames)])

    def done(job: int, t: TensorRef, frame: Any) -> None:
        """A step's output: to the next step's queue, or to the client."""
        j = jobs[job]
        j.step += 1
        if j.step < len(j.plan):
            model, name, _ = j.plan[j.step]
            ref = TensorRef(name or t.name, t.datatype, t.shape, None, 0)
            models[model].queue.append((job, (ref,), [frame], time.monotonic_ns()))
            return
        del jobs[job]
        out = j.plan[-1][2]
        ref = TensorRef(out or t.name, t.datatype, t.shape, None, 0)
        header = {"id": j.rid, "status": 0, "body": {"model": j.model, "version": 1, "outputs": [ref]}}
        if j.client in bundling:
            held.setdefault(j.client, []).append((Command.REPLY, header, [frame]))
        else:
            front.send_multipart([j.client, *protocol.encode(Command.REPLY, header, [frame])])

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
                        take(client, protocol.infer_from_wire(entry.header), entry.frames)
                    continue
                infer = protocol.decode_infer(msg)
                if infer is None:
                    raise SystemExit("the floor takes only well-formed INFERs")
                take(client, infer.record, infer.frames)
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
                m, wid, waiting = in_flight.pop(result.batch)
                m.free.append(wid)
                m.executions += 1 if m.batched else len(result.results)
                m.success += len(result.results)
                m.compute_ns += sum(result.timings)
                for res in result.results:
                    if res.status != 0 or len(res.outputs) != 1:
                        raise SystemExit(f"the floor takes one output and no errors: {res!r}")
                    t = res.outputs[0]
                    done(waiting[res.id], t, got.frames[floor_procs._frame(t)])
            for client, replies in held.items():  # a turn's replies to a bundling client: one message
                if len(replies) == 1:
                    front.send_multipart([client, *protocol.encode(*replies[0])])
                else:
                    for i in range(0, len(replies), protocol.MAX_BUNDLE):
                        chunk = replies[i : i + protocol.MAX_BUNDLE]
                        front.send_multipart([client, *protocol.encode_bundle(chunk)])
            held.clear()
        for m in models.values():  # free instances take what waits
            while m.queue and m.free:
                dispatch(m)


# ------------------------------------------------------------------------------------------ client side


class EnsClient(floor_procs.FloorClient):
    """``FloorClient`` for ``add`` or ``text_ensemble``: the same INFER/BUNDLE and REPLY work, the request's
    own inputs (``BYTES`` serialized per request, as zinfer's client does), each reply's latency kept."""

    def __init__(self, model: str, text: bytes) -> None:
        super().__init__(arrays=True)
        self.model = model
        self._text = np.array([[text]], dtype=object)
        if model != "add":
            self._outputs = (OutputRequest("RESULT"),)
        self.sent: dict[str, float] = {}
        self.lats: list[float] = []
        self.last: Any = None

    def _one(self) -> tuple[str, InferRequest, list[Any]]:
        self._n += 1
        rid = f"{self._prefix}{self._n}"
        self._waiting.add(rid)
        self.sent[rid] = time.perf_counter()
        if self.model == "add":
            named = (("INPUT_A", self._a), ("INPUT_B", self._b))
            inputs = tuple(TensorRef(name, "FP32", x.shape, None, i) for i, (name, x) in enumerate(named))
            payload = [x.tobytes() for _, x in named]
        else:
            inputs = (TensorRef("TEXT", "BYTES", (1, 1), None, 0),)
            payload = [dtypes.serialize_bytes(self._text)]
        return rid, InferRequest(rid, self.model, 0, inputs, self._outputs, caller_id=""), payload

    def _output(self, reply: Reply, frames: list[Any]) -> Any:
        try:
            self._waiting.remove(reply.request_id)
        except KeyError:
            raise RuntimeError(f"a reply to no request: {reply.request_id!r}") from None
        self.lats.append((time.perf_counter() - self.sent.pop(reply.request_id)) * 1e6)
        if reply.status != 0:
            raise RuntimeError(reply.error)
        out = reply.body["outputs"][0]
        data = frames[out["frame"]]
        if out["datatype"] == "BYTES":
            self.last = dtypes.deserialize_bytes(data, out["shape"])
        else:
            self.last = np.frombuffer(data, floor_procs.DTYPES[out["datatype"]]).reshape(out["shape"])
        return self.last


def main() -> None:
    role, back, *rest = sys.argv[1:]
    if role == "broker":  # FRONT BACK [--one] MODEL...
        one = rest[1] == "--one"
        broker(back, rest[0], rest[2:] if one else rest[1:], runs=not one)
    elif role == "worker":  # the model's own model.py, from the repository the run wrote
        with open(rest[1]) as f:
            floor_pb.worker(back, rest[0], f.read())
    else:
        raise SystemExit("role must be broker or worker")
