"""A batch leaves as soon as it may: when an instance gives its place back, its model's next batch is sent
before the replies of the batch that ended are built (``WorkerInbox.on_result``: ``Completion.take_result``,
``Dispatcher.dispatch_freed``, then ``Completion.on_result``), and a queue that reaches a preferred batch
size in the middle of a turn is asked for a batch then (``DynamicBatcher.reached_preferred``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zinfer.broker.batching.batch_policy import BatchPolicy, QueuedRequest
from zinfer.broker.batching.batcher import DynamicBatcher
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
from zinfer.broker.worker_inbox import WorkerInbox
from zinfer.client.protocol import Command, Frame, InferRequest, Reply
from zinfer.client.worker_protocol import RequestResult, WorkerResult
from zinfer.modelconfig.model_config import parse_model_config

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 6 ] max_queue_delay_microseconds: 100000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


class Recorder(Outbox):
    """The broker's outbox without sockets: what was sent, in order."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def send_client(self, identity: bytes, reply: Reply, frames: list[Frame] | None = None) -> None:
        self.log.append(f"reply {reply.request_id}")

    def send_worker(
        self, identity: bytes, command: Command, header: dict[str, Any], frames: list[Frame] | None = None
    ) -> bool:
        self.log.append(f"{command.name} {identity.decode()}")
        return True


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ([1, 1, 1], [False, False, False]),
        ([1, 1, 1, 1], [False, False, False, True]),  # 4: preferred
        ([1, 1, 1, 1, 1, 1], [False, False, False, True, False, True]),  # 4 and 6
        ([3, 3], [False, True]),  # 3 -> 6 passes 4 and reaches 6
        ([5], [True]),  # passes 4 in one request
        ([1] * 8, [False, False, False, True, False, True, False, True]),  # 8: the largest batch
    ],
)
def test_reached_preferred_says_when_a_request_takes_the_queue_to_a_preferred_size(
    sizes: list[int], want: list[bool]
) -> None:
    config = parse_model_config(CONFIG, source="config.pbtxt", model_name="m")
    batcher: DynamicBatcher[int] = DynamicBatcher(BatchPolicy.from_config(config))
    got = []
    for i, rows in enumerate(sizes):
        batcher.add(QueuedRequest(i, rows, (), 0.0), 0.0)
        got.append(batcher.reached_preferred(rows))
    assert got == want


def test_no_batching_policy_never_hints() -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(BatchPolicy(max_batch_size=0))
    batcher.add(QueuedRequest(0, 1, (), 0.0), 0.0)
    assert not batcher.reached_preferred(1)


def _pending(seq: int, sequence_id: int = 0) -> Pending:
    params = {"sequence_id": sequence_id, "sequence_start": True} if sequence_id else {}
    return Pending(seq, b"client", InferRequest(f"r{seq}", "m", 1, (), parameters=params), [], (), 1, 0.0)


def _inbox(sequence: bool) -> tuple[WorkerInbox, ModelState, InstancePool, list[str]]:
    """The broker's worker inbox, completion and dispatch around one model with one instance, ``w0``."""
    text = CONFIG.replace("dynamic_batching", "sequence_batching { }\n#") if sequence else CONFIG
    state = ModelState(parse_model_config(text, source="config.pbtxt", model_name="m"), 1, Path("/none"), 1)
    state.metrics = ServerMetrics(gpu=False, process=False).model("m", 1, 8)
    pool = InstancePool(10.0)
    pool.add(b"w0", state, 0.0)
    pool.ready(b"w0")
    log: list[str] = []
    outbox = Recorder(log)
    limiter: RateLimiter[bytes, Any] = RateLimiter(())
    completion = Completion(pool, outbox, CachePath(0), limiter, lambda: [state], Tracer())
    dispatcher = Dispatcher(ModelRegistry(()), RegionTable(1 << 20), pool, outbox, completion, limiter,
                            LimitedDispatch(limiter, pool, None, completion))  # type: ignore[arg-type]  # fmt: skip
    return WorkerInbox(pool, outbox, completion, dispatcher), state, pool, log


def test_the_next_batch_is_dispatched_before_the_replies_of_the_batch_that_ended() -> None:
    inbox, state, pool, log = _inbox(sequence=False)
    pool.take_next(state)
    running = pool.start_batch(state, b"w0", [_pending(1), _pending(2)], 0)
    state.scheduler.add(_pending(3), (), 0.0, False)  # queued while the batch ran; its delay is over
    results = (RequestResult(1), RequestResult(2))
    inbox.on_result(b"w0", state, WorkerResult(running.batch_id, results), [])
    assert log == ["W_EXECUTE w0", "reply r1", "reply r2"]  # the place came back before any reply
    assert list(state.idle) == [] and len(state.scheduler) == 0  # taken once, by the next batch


def test_a_sequence_models_instance_is_freed_only_after_its_replies() -> None:
    inbox, state, pool, log = _inbox(sequence=True)
    pool.take_next(state)
    running = pool.start_batch(state, b"w0", [_pending(1, sequence_id=7)], 0)
    state.scheduler.add(_pending(2, sequence_id=8), (), 0.0, False)  # another sequence, on the same instance
    inbox.on_result(b"w0", state, WorkerResult(running.batch_id, (RequestResult(1),)), [])
    assert log == ["reply r1"]  # its next request waits for this one's end: no early dispatch
    assert list(state.idle) == [b"w0"] and len(state.scheduler) == 1
