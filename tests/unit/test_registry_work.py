"""The registry's set of states with work (``ModelRegistry.working``), which the broker loop walks each turn
instead of every model: a state is in it exactly while it has queued requests, timed-out ones not yet
answered, or open sequences (whose idle limit runs on time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zinfer.broker.batching.batcher import DynamicBatcher, QueuedRequest
from zinfer.broker.batching.sequence_batcher import SequenceBatcher, SequenceRequest
from zinfer.broker.model_state import ModelState
from zinfer.broker.registry import ModelRegistry
from zinfer.broker.scheduler import Batching
from zinfer.broker.sequence_scheduler import Sequences
from zinfer.modelconfig.model_config import parse_model_config

BASE = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""
SEQUENCE = "sequence_batching { max_sequence_idle_microseconds: 1000000 }\n"
TIMEOUT = "dynamic_batching { default_queue_policy { default_timeout_microseconds: 1000 } }\n"


def registry(**extra: str) -> tuple[ModelRegistry, dict[str, ModelState]]:
    reg = ModelRegistry()
    states = {}
    for name, more in extra.items():
        config = parse_model_config(BASE.format(name=name) + more, source="config.pbtxt", model_name=name)
        states[name] = ModelState(config, 1, Path(f"/nonexistent/{name}/1"), 1)
        reg.install(name, [states[name]])
    return reg, states


def batcher(state: ModelState) -> DynamicBatcher[Any]:
    """The dynamic batcher of a model scheduled by one (``scheduler.Batching``)."""
    assert isinstance(state.scheduler, Batching)
    return state.scheduler.batcher  # type: ignore[return-value]  # its items here are plain values


def queue(reg: ModelRegistry, state: ModelState, item: Any, now: float = 0.0) -> None:
    batcher(state).add(QueuedRequest(item=item, batch_size=1, shape_key="a", arrival=now), now)
    reg.has_work(state)


def test_only_states_with_queued_requests_are_walked_in_the_order_they_got_work() -> None:
    reg, s = registry(a="", b="", c="")
    assert reg.working() == []
    queue(reg, s["c"], 1)
    queue(reg, s["a"], 2)
    queue(reg, s["c"], 3)
    assert reg.working() == [s["c"], s["a"]]
    assert len(list(reg.states())) == 3  # the full walk still sees every model


def test_a_state_leaves_once_its_queue_is_empty_and_comes_back_with_its_next_request() -> None:
    reg, s = registry(a="", b="")
    queue(reg, s["a"], 1)
    queue(reg, s["b"], 2)
    [batch] = batcher(s["a"]).pop_ready(10.0, 1)
    assert list(batch.items) == [1]
    assert reg.working() == [s["b"]]
    assert reg.working() == [s["b"]]  # and it stays out
    queue(reg, s["a"], 3)
    assert reg.working() == [s["b"], s["a"]]


def test_timed_out_requests_held_for_expire_keep_the_state_in_until_they_are_answered() -> None:
    reg, s = registry(t=TIMEOUT)
    queue(reg, s["t"], 1)
    assert batcher(s["t"]).pop_ready(0.01, 0) == []  # no instance free: the request timed out and is held
    assert len(batcher(s["t"])) == 0
    assert reg.working() == [s["t"]]
    assert batcher(s["t"]).expire(0.01) == [1]
    assert reg.working() == []


def test_an_open_sequence_keeps_its_state_in_until_its_idle_limit_releases_it() -> None:
    reg, s = registry(q=SEQUENCE)
    assert isinstance(s["q"].scheduler, Sequences)
    seqs: SequenceBatcher[Any, bytes] = s["q"].scheduler.batcher  # type: ignore[assignment]
    seqs.add(SequenceRequest("r1", 7, True, False, 0.0), 0.0, [b"w"])
    reg.has_work(s["q"])
    [(worker, batch)] = seqs.pop_ready(0.0, [b"w"])
    assert worker == b"w" and len(batch.requests) == 1
    seqs.done([7], 0.1)
    assert len(seqs) == 0 and seqs.active() == 1
    assert reg.working() == [s["q"]]  # nothing queued, but its idle limit is a deadline
    seqs.expire(1.2)
    assert seqs.active() == 0
    assert reg.working() == []


def test_a_retired_state_that_stopped_is_gone_from_both_lists() -> None:
    reg, s = registry(a="")
    queue(reg, s["a"], 1)
    reg.retire([s["a"]])
    assert reg.retiring == [s["a"]] and reg.working() == [s["a"]]  # it drains its queue first
    reg.drop_retired(s["a"])
    assert reg.retiring == [] and reg.working() == []
