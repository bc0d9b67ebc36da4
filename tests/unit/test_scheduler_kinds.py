"""One scheduler per model, picked once at load from its config (``model_state.scheduler_for``), each with
the same shape: ``add``, ``pop_ready(now, idle) -> [(instance, batches)]``, ``next_deadline(idle)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zinfer.broker.ensemble_plan import EnsemblePlan
from zinfer.broker.model_state import ModelState, Pending
from zinfer.broker.scheduler import Batching, EnsembleSteps, Runs, TakingTurns
from zinfer.broker.sequence_scheduler import Sequences
from zinfer.client.errors import InvalidArgument, Unavailable
from zinfer.client.protocol import InferRequest
from zinfer.modelconfig.model_config import parse_model_config

BASE = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
GROUP = "instance_group [ { kind: KIND_CPU count: 2 } ]\n"
LIMITED = (
    'instance_group [ { kind: KIND_CPU count: 2 rate_limiter { resources [ { name: "R" count: 1 } ] } } ]\n'
)
DYNAMIC = (
    "dynamic_batching { max_queue_delay_microseconds: 1000 default_queue_policy { max_queue_size: 2 } }\n"
)
SEQUENCE = "sequence_batching { max_sequence_idle_microseconds: 1000000 }\n"
LIMIT = 'parameters { key: "execution_timeout_ms" value: { string_value: "500" } }\n'


def state(extra: str, plan: EnsemblePlan | None = None) -> ModelState:
    config = parse_model_config(BASE + extra, source="config.pbtxt", model_name="m")
    return ModelState(config, 1, Path("/none/m/1"), 2, plan=plan)


def pending(seq: int, arrival: float = 0.0, **params: Any) -> Pending:
    return Pending(seq, b"c", InferRequest(f"r{seq}", "m", 1, (), parameters=params), [], (), 1, arrival)


@pytest.mark.parametrize(
    ("extra", "kind", "inner", "eager", "pipelines"),
    [
        (GROUP, Runs, None, True, True),  # the default scheduler of a model whose instances pipeline
        (GROUP + LIMIT, Batching, None, True, False),  # an execution limit: no pipelining, no runs
        (DYNAMIC + GROUP, Batching, None, True, False),
        (SEQUENCE + GROUP, Sequences, None, False, False),
        (DYNAMIC + LIMITED, TakingTurns, Batching, False, False),
        (SEQUENCE + LIMITED, TakingTurns, Sequences, False, False),
        (LIMITED, TakingTurns, Batching, False, False),  # rate-limited: no pipelining, no runs
    ],
)
def test_the_kind_is_picked_once_from_the_config(
    extra: str, kind: type, inner: type | None, eager: bool, pipelines: bool
) -> None:
    s = state(extra)
    assert type(s.scheduler) is kind
    if inner is not None:
        assert isinstance(s.scheduler, TakingTurns) and type(s.scheduler.inner) is inner
    assert (s.scheduler.eager, s.scheduler.pipelines) == (eager, pipelines)
    assert s.scheduler.takes_turns == (kind is TakingTurns)
    assert s.scheduler.plan is None and s.queued == 0 and not s.scheduler.has_work()


def test_an_ensemble_has_no_queue_and_is_ready_without_instances() -> None:
    plan = EnsemblePlan("e", (), frozenset(), frozenset(), {}, {})
    s = state(GROUP, plan=plan)
    assert type(s.scheduler) is EnsembleSteps and s.scheduler.plan is plan
    assert s.ready and s.state() == "READY"
    assert s.scheduler.pop_ready(0.0, [b"w"]) == [] and s.scheduler.next_deadline([b"w"]) is None


def test_batching_pairs_each_batch_with_the_next_idle_place_in_line() -> None:
    s = state(DYNAMIC + GROUP)
    sched = s.scheduler
    sched.add(pending(1), (), 0.0, False)
    assert sched.next_deadline([b"a"]) == pytest.approx(0.001)  # the queue delay, with a place free
    assert sched.pop_ready(0.0005, [b"a", b"b"]) == []  # still waiting for companions
    [(worker, batches)] = sched.pop_ready(0.002, [b"b", b"a"])
    assert worker == b"b" and [p.seq for p in batches[0].items] == [1]


def test_a_full_queue_is_unavailable_and_queues_nothing() -> None:
    sched = state(DYNAMIC + GROUP).scheduler
    sched.add(pending(1), (), 0.0, False)
    sched.add(pending(2), (), 0.0, False)
    with pytest.raises(Unavailable):
        sched.add(pending(3), (), 0.0, False)
    assert len(sched) == 2


def test_runs_split_a_backlog_over_the_instances_running_nothing() -> None:
    sched = state(GROUP).scheduler
    assert isinstance(sched, Runs)
    sched.cost.observe(100_000, 1)  # one execution: 0.1 ms
    for i in range(6):
        sched.add(pending(i), (), 0.0, False)
    ready = sched.pop_ready(0.0, [b"a", b"a", b"b", b"b"])  # two instances, two places each
    assert [(w, [len(b.items) for b in run]) for w, run in ready] == [(b"a", [1, 1, 1]), (b"b", [1, 1, 1])]
    assert len(sched) == 0


def test_runs_are_not_formed_where_an_instance_runs_its_batches_side_by_side() -> None:
    sched = state(GROUP).scheduler
    assert isinstance(sched, Runs)
    sched.cost.observe(100_000, 1)
    sched.side_by_side = True  # an async execute's instance took more places (instance_pool.second_place)
    for i in range(6):
        sched.add(pending(i), (), 0.0, False)
    places = [b"a"] * 4 + [b"b"] * 4
    ready = sched.pop_ready(0.0, places)  # each request alone, to a free place, all in this turn
    assert [(w, [len(b.items) for b in run]) for w, run in ready] == [(w, [1]) for w in places[:6]]
    assert len(sched) == 0


def test_taking_turns_gives_one_batch_per_turn() -> None:
    sched = state(LIMITED).scheduler  # the default scheduler: each request its own batch
    sched.add(pending(1), (), 0.0, False)
    sched.add(pending(2), (), 0.0, False)
    [(worker, _)] = sched.pop_ready(1.0, [b"a", b"b"])
    assert worker == b"a" and len(sched) == 1


def test_a_sequence_request_is_checked_and_bound_to_an_instance_at_its_start() -> None:
    s = state(SEQUENCE + GROUP)
    s.instances.update({b"a", b"b"})
    sched = s.scheduler
    with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty sequence_id"):
        sched.add(pending(1), (), 0.0, False)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        sched.add(pending(2, sequence_id=7), (), 0.0, False)
    assert len(sched) == 0 and sched.active() == 0
    sched.add(pending(3, sequence_id=7, sequence_start=True), (), 0.0, False)
    [(worker, [batch])] = sched.pop_ready(0.0, [b"a", b"b"])
    assert [p.seq for p in batch.items] == [3] and sched.active() == 1
    sched.add(pending(4, sequence_id=7), (), 0.1, False)
    assert sched.pop_ready(0.2, [b"a", b"b"]) == []  # its next request waits for the last one's end
    sched.done(batch.items, 0.3)
    [(again, _)] = sched.pop_ready(0.3, [b"a", b"b"])
    assert again == worker  # the sequence stays on its instance
    assert sched.drop_instance(worker) == [] and sched.active() == 0
