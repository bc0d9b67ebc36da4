"""Send first, account after: a worker's EXECUTE and a client's reply leave before the batch's and the
request's statistics, metrics and latency window are recorded (``Dispatcher.send``,
``Completion.on_result``); once the call returns, the figures are the same as before. And a RESULT's replies
leave as the workers' socket is read, before the turn's client messages (``drain.drain_workers``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zinfer.broker.batching.batch_policy import Batch, BatchReason
from zinfer.broker.batching.rate_limiter import RateLimiter
from zinfer.broker.cache_path import CachePath
from zinfer.broker.completion import Completion
from zinfer.broker.dispatcher import Dispatcher
from zinfer.broker.instance_pool import InstancePool
from zinfer.broker.limited_dispatch import LimitedDispatch
from zinfer.broker.metrics import ServerMetrics
from zinfer.broker.model_state import ModelState, Pending
from zinfer.broker.outbox import Outbox
from zinfer.broker.regions import RegionTable
from zinfer.broker.registry import ModelRegistry
from zinfer.broker.tracing import Tracer
from zinfer.client.errors import Status
from zinfer.client.protocol import Command, Frame, InferRequest, Reply
from zinfer.client.worker_protocol import RequestResult, WorkerResult
from zinfer.modelconfig.model_config import parse_model_config

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


class Recorder(Outbox):
    """The broker's outbox without sockets: each send notes what the model's figures said at that moment."""

    def __init__(self, log: list[str], state: ModelState) -> None:
        super().__init__()
        self.log, self.state = log, state

    def _figures(self) -> str:
        s = self.state.stats
        return f"executions={s.execution_count} successes={s.success.count} failures={s.fail.count}"

    def send_client(self, identity: bytes, reply: Reply, frames: list[Frame] | None = None) -> None:
        self.log.append(f"reply {reply.request_id} {self._figures()}")

    def send_worker(
        self, identity: bytes, command: Command, header: dict[str, Any], frames: list[Frame] | None = None
    ) -> bool:
        self.log.append(f"{command.name} {self._figures()}")
        return True


def _pending(seq: int) -> Pending:
    return Pending(seq, b"client", InferRequest(f"r{seq}", "m", 1, ()), [], (), 1, 0.0)


def _setup() -> tuple[Dispatcher, Completion, ModelState, InstancePool, list[str]]:
    state = ModelState(parse_model_config(CONFIG, source="config.pbtxt", model_name="m"), 1, Path("/none"), 1)
    state.metrics = ServerMetrics(gpu=False, process=False).model("m", 1, 8)
    pool = InstancePool(10.0)
    pool.add(b"w0", state, 0.0)
    pool.ready(b"w0")
    log: list[str] = []
    outbox = Recorder(log, state)
    limiter: RateLimiter[bytes, Any] = RateLimiter(())
    completion = Completion(pool, outbox, CachePath(0), limiter, lambda: [state], Tracer())
    registry = ModelRegistry(())
    path = Dispatcher(registry, RegionTable(1 << 20), pool, outbox, completion, limiter,
                       LimitedDispatch(limiter, pool, None, completion))  # type: ignore[arg-type]  # fmt: skip
    return path, completion, state, pool, log


def test_the_execute_leaves_before_the_batch_is_counted() -> None:
    path, _, state, pool, log = _setup()
    worker = pool.take_next(state)
    batch = Batch(items=(_pending(1), _pending(2)), size=2, reason=BatchReason.DELAY_EXPIRED)
    path.send(state, worker, [batch], 1.0)
    assert log == ["W_EXECUTE executions=0 successes=0 failures=0"]
    assert state.stats.execution_count == 1 and state.stats.batch_reasons == {"delay_expired": 1}
    assert state.stats.queue.count == 2


def test_every_reply_leaves_before_the_requests_are_counted() -> None:
    _, completion, state, pool, log = _setup()
    pool.take_next(state)
    running = pool.start_batch(state, b"w0", [_pending(1), _pending(2), _pending(3)], 0)
    results = (RequestResult(1), RequestResult(2, status=Status.INTERNAL, error="InternalError: no"))
    result = WorkerResult(running.batch_id, results, timings=(10, 20, 30))
    batch = completion.take_result(b"w0", state, result)
    assert batch is not None
    completion.on_result(b"w0", state, batch, result, [])
    assert log == [
        "reply r1 executions=0 successes=0 failures=0",
        "reply r2 executions=0 successes=0 failures=0",
        "reply r3 executions=0 successes=0 failures=0",  # forgotten by the worker: Unavailable
    ]
    stats = state.stats
    assert (stats.success.count, stats.fail.count, stats.inference_count) == (1, 1, 1)
    assert (stats.compute_input.ns, stats.compute_infer.ns, stats.compute_output.ns) == (10, 20, 30)
    assert list(state.idle) == [b"w0"]


def _arrived(seq: int, arrival: float) -> Pending:
    return Pending(seq, b"client", InferRequest(f"r{seq}", "m", 1, ()), [], (), 1, arrival)


def test_a_runs_queue_times_are_each_requests_and_its_delay_the_oldests() -> None:
    path, _, state, pool, _ = _setup()
    worker = pool.take_next(state)
    arrivals = (0.25, 0.125, 0.75, 0.5, 0.0625)
    first = Batch(items=tuple(_arrived(i, a) for i, a in enumerate(arrivals[:3])), size=3,
                  reason=BatchReason.PREFERRED)  # fmt: skip
    second = Batch(items=tuple(_arrived(i + 3, a) for i, a in enumerate(arrivals[3:])), size=2,
                   reason=BatchReason.DELAY_EXPIRED)  # fmt: skip
    path.send(state, worker, [first, second], 1.0)
    assert state.stats.queue.count == 5
    assert state.stats.queue.ns == sum(int((1.0 - a) * 1e9) for a in arrivals)
    assert state.stats.batch_sizes == {3: 1, 2: 1}
    assert state.stats.batch_reasons == {"preferred": 1, "delay_expired": 1}
    assert state.metrics._delay_us == (1.0 - 0.125) * 1e6 + (1.0 - 0.0625) * 1e6  # each batch's oldest
    assert state.metrics._reasons["preferred"] == 1 and state.metrics._reasons["delay_expired"] == 1


def test_a_results_replies_leave_when_the_workers_socket_is_read_not_at_the_turns_end() -> None:
    """``drain_workers``: the replies a worker's RESULT completed reach their client as the worker socket
    is read, before the turn reads its clients' messages; the outbox then holds again for the rest of the
    turn."""
    import uuid

    import zmq

    from zinfer.broker.drain import drain_workers
    from zinfer.broker.outbox import IPC_TAG
    from zinfer.client import protocol

    ctx = zmq.Context.instance()
    tag = uuid.uuid4().hex
    backend, worker = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    frontend, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    socks = (backend, worker, frontend, client)
    try:
        backend.bind(f"inproc://w-{tag}")
        worker.connect(f"inproc://w-{tag}")
        frontend.bind(f"inproc://c-{tag}")
        client.setsockopt(zmq.IDENTITY, b"c1")
        client.connect(f"inproc://c-{tag}")
        outbox = Outbox()
        outbox.attach(frontend, backend)
        outbox.bundles_to(IPC_TAG + b"c1")
        outbox.hold()  # the turn's start, as the server loop does

        def on_worker(identity: bytes, frames: list[Frame]) -> None:
            outbox.send_client(IPC_TAG + b"c1", Reply("r1", Status.OK))  # completed by this RESULT

        def replies() -> list[str]:
            if not client.poll(1000):
                return []
            raw = client.recv_multipart(copy=False)
            return [reply.request_id for reply, _ in protocol.decode_replies([f.buffer for f in raw])]

        worker.send(b"result")
        assert backend.poll(1000) == zmq.POLLIN
        assert drain_workers(backend, on_worker, outbox) is False
        assert replies() == ["r1"]  # sent already: the turn's end (``flush``) has not come
        outbox.send_client(IPC_TAG + b"c1", Reply("r2", Status.OK))  # later in the turn: held again
        assert client.poll(50) == 0
        outbox.flush()
        assert replies() == ["r2"]
    finally:
        for s in socks:
            s.close(linger=0)
