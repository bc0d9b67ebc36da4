"""The instance pool (``zinfer.broker.instance_pool``), pure with the clock passed in: places (the GPU
look-ahead's second place included), readiness, in-flight batches and liveness, table by table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zinfer.broker.instance_pool import InstancePool
from zinfer.broker.model_state import ModelState
from zinfer.modelconfig.model_config import parse_model_config

MS = 1_000_000
BASE = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
KINDS = {
    "plain": 'instance_group [ { kind: KIND_CPU count: 2 } ]\nparameters { key: "execution_timeout_ms" '
    'value: { string_value: "100" } }',
    "sequence": "sequence_batching { max_sequence_idle_microseconds: 1000000 }\n"
    "instance_group [ { kind: KIND_CPU count: 2 } ]",
    "pipelined": "instance_group [ { kind: KIND_CPU count: 2 } ]",
    "rate_limited": 'instance_group [ { kind: KIND_CPU count: 2 rate_limiter { resources [ { name: "R" '
    "count: 1 } ] } } ]",
}


def model(kind: str = "plain") -> ModelState:
    config = parse_model_config(BASE + KINDS[kind], source="config.pbtxt", model_name="m")
    return ModelState(config, 1, Path("/nonexistent/m/1"), 2)


def play(pool: InstancePool, state: ModelState, steps: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``steps`` (an operation and its worker) against the pool; what each returned."""
    answers: list[Any] = []
    for op, *args in steps:
        if op == "add":
            pool.add(args[0], state, 0.0)
            answers.append(None)
        elif op == "ready":
            answers.append(pool.ready(args[0]) is state)
        elif op == "second":
            answers.append(pool.second_place(*args))
        elif op == "take_next":
            answers.append(pool.take_next(state))
        elif op == "take":
            answers.append(pool.take(state, args[0]))
        elif op == "give_back":
            answers.append(pool.give_back(state, args[0]))
        elif op == "withdraw":
            answers.append(pool.withdraw(state, args[0]))
        elif op == "remove":
            gone, ever_ready = pool.remove(args[0])
            answers.append((gone is state, ever_ready))
        elif op == "retire":
            answers.append(sorted(pool.retire(state)))
        else:
            raise AssertionError(op)
    return answers


# (name, model kind, steps, what each step returned, places after, instances after, fully started)
PLACES: list[tuple[str, str, list[tuple[Any, ...]], list[Any], list[bytes], set[bytes], bool]] = [
    ("READY gives one place", "plain", [("add", b"a"), ("ready", b"a")], [None, True], [b"a"], {b"a"}, False),
    ("both instances ready: started", "plain",
     [("add", b"a"), ("add", b"b"), ("ready", b"a"), ("ready", b"b")], [None, None, True, True],
     [b"a", b"b"], {b"a", b"b"}, True),
    ("READY of an unknown worker changes nothing", "plain", [("ready", b"x")], [False], [], set(), False),
    ("a second place for a GPU look-ahead instance", "plain",
     [("add", b"a"), ("ready", b"a"), ("second", b"a")], [None, True, True], [b"a", b"a"], {b"a"}, False),
    ("no second place before the first READY", "plain", [("add", b"a"), ("second", b"a")], [None, False], [],
     set(), False),
    ("no second place for a sequence model", "sequence", [("add", b"a"), ("ready", b"a"), ("second", b"a")],
     [None, True, False], [b"a"], {b"a"}, False),
    ("no second place for a rate-limited model", "rate_limited",
     [("add", b"a"), ("ready", b"a"), ("second", b"a")], [None, True, False], [b"a"], {b"a"}, False),
    ("a pipelining instance has its second place at READY; a look-ahead adds none", "pipelined",
     [("add", b"a"), ("ready", b"a"), ("second", b"a", 2)], [None, True, False], [b"a", b"a"], {b"a"}, False),
    ("an async execute's instance gets each place it asks for", "pipelined",
     [("add", b"a"), ("ready", b"a"), ("second", b"a", 2), ("second", b"a", 3), ("second", b"a", 4)],
     [None, True, False, True, True], [b"a"] * 4, {b"a"}, False),
    ("an async execute's sequence model gets no further place", "sequence",
     [("add", b"a"), ("ready", b"a"), ("second", b"a", 2), ("second", b"a", 3)], [None, True, False, False],
     [b"a"], {b"a"}, False),
    ("a batch takes the next place; its result gives it back at the end of the line", "plain",
     [("add", b"a"), ("add", b"b"), ("ready", b"a"), ("ready", b"b"), ("take_next",), ("give_back", b"a")],
     [None, None, True, True, b"a", None], [b"b", b"a"], {b"a", b"b"}, True),
    ("a named place is taken", "plain", [("add", b"a"), ("add", b"b"), ("ready", b"a"), ("ready", b"b"),
     ("take", b"b")], [None, None, True, True, None], [b"a"], {b"a", b"b"}, True),
    ("a result from a worker that left gives no place back", "plain",
     [("add", b"a"), ("ready", b"a"), ("take_next",), ("remove", b"a"), ("give_back", b"a")],
     [None, True, b"a", (True, True), None], [], set(), False),
    ("a removed worker loses both its places", "plain",
     [("add", b"a"), ("ready", b"a"), ("second", b"a"), ("remove", b"a")], [None, True, True, (True, True)],
     [], set(), False),
    ("a worker gone before READY was never ready", "plain", [("add", b"a"), ("remove", b"a")],
     [None, (True, False)], [], set(), False),
    ("a withdrawn worker keeps its instance, not its places", "plain",
     [("add", b"a"), ("ready", b"a"), ("second", b"a"), ("withdraw", b"a")], [None, True, True, None], [],
     {b"a"}, False),
    ("retiring clears instances and places and names them", "plain",
     [("add", b"a"), ("add", b"b"), ("ready", b"b"), ("ready", b"a"), ("retire",)],
     [None, None, True, True, [b"a", b"b"]], [], set(), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "steps", "answers", "idle", "instances", "started"),
    [row[1:] for row in PLACES],
    ids=[row[0] for row in PLACES],
)
def test_places_and_readiness(
    kind: str,
    steps: list[tuple[Any, ...]],
    answers: list[Any],
    idle: list[bytes],
    instances: set[bytes],
    started: bool,
) -> None:
    pool = InstancePool(liveness_s=5.0)
    state = model(kind)
    assert play(pool, state, steps) == answers
    assert list(state.idle) == idle
    assert state.instances == instances
    assert pool.started(state) is started
    # a place past the second: the instance runs batches side by side, its scheduler forms no runs
    steps_ok = zip(steps, answers, strict=True)
    further = [ok for (op, *args), ok in steps_ok if op == "second" and args[1:] > [2]]
    assert state.scheduler.side_by_side is any(further)


# (name, heartbeats as (worker, time), check times, the workers named silent at each check)
LIVENESS: list[tuple[str, list[tuple[bytes, float]], list[float], list[list[bytes]]]] = [
    ("a starting worker gets the startup grace", [], [59.0, 61.0], [[], [b"a", b"b"]]),
    ("after a heartbeat, the liveness interval", [(b"a", 10.0)], [15.0, 15.5], [[], [b"a"]]),
    ("each silence is named once", [(b"a", 10.0)], [16.0, 17.0], [[b"a"], []]),
    ("one of two workers stops", [(b"a", 10.0), (b"b", 10.0), (b"b", 14.0)], [16.0], [[b"a"]]),
]


@pytest.mark.parametrize(
    ("beats", "checks", "silent"), [row[1:] for row in LIVENESS], ids=[row[0] for row in LIVENESS]
)
def test_liveness(beats: list[tuple[bytes, float]], checks: list[float], silent: list[list[bytes]]) -> None:
    pool = InstancePool(liveness_s=5.0, startup_grace_s=60.0)
    state = model()  # b never heartbeats: it is named only past the startup grace
    pool.add(b"a", state, 0.0)
    pool.add(b"b", state, 0.0)
    for worker, at in beats:
        assert pool.heartbeat(worker, at)
    assert [[w for w, _ in pool.silent(now)] for now in checks] == silent


def test_heartbeats_of_unknown_or_removed_workers_are_not_counted() -> None:
    pool = InstancePool(liveness_s=5.0, startup_grace_s=60.0)
    pool.add(b"a", model(), 0.0)
    assert not pool.heartbeat(b"x", 1.0)
    pool.remove(b"a")
    assert not pool.heartbeat(b"a", 1.0)
    assert pool.silent(1000.0) == []


def test_in_flight_batches() -> None:
    pool = InstancePool(liveness_s=5.0)
    state, other = model(), model()
    one = pool.start_batch(state, b"a", [], 0)
    two = pool.start_batch(state, b"a", [], 10 * MS)  # a second place's batch, queued behind the first
    three = pool.start_batch(other, b"b", [], 20 * MS)
    assert len({one.batch_id, two.batch_id, three.batch_id}) == 3
    assert pool.busy(state) and pool.busy(other)
    assert pool.busy_since() == {b"a": 0, b"b": 20 * MS}  # a busy worker's oldest batch
    assert [b.batch_id for b in pool.overdue(105 * MS)] == [one.batch_id]  # limit 100 ms, per worker
    assert pool.finish_batch(three.batch_id, b"a") is None  # named by the wrong worker: stale, dropped
    assert pool.finish_batch(three.batch_id, b"b") is None  # and gone
    assert not pool.busy(other)
    assert pool.batch(two.batch_id) is two
    assert pool.take_batches(b"a") == [one, two]
    assert not pool.running()
    pool.start_batch(state, b"a", [], 0)
    assert len(pool.take_all_batches()) == 1 and not pool.running()


def test_idle_instances_come_before_second_places_of_busy_ones() -> None:
    """With look-ahead places, a batch goes to an idle instance before it queues behind a busy one."""
    pool = InstancePool(liveness_s=5.0)
    state = model()
    for w in (b"a", b"b"):
        pool.add(w, state, 0.0)
        pool.ready(w)
    pool.second_place(b"a")
    assert list(state.idle) == [b"a", b"b", b"a"]
    pool.idle_first(state)
    assert list(state.idle) == [b"a", b"b", b"a"]  # nothing busy: the order stays
    pool.start_batch(state, pool.take_next(state), [], 0)
    pool.idle_first(state)
    assert list(state.idle) == [b"b", b"a"]
    pool.start_batch(model(), b"b", [], 0)  # another model's batch on a worker named alike does not count
    pool.idle_first(state)
    assert list(state.idle) == [b"b", b"a"]
