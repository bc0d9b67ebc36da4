"""Runs (``zinfer.broker.batching.runs``): how many queued requests of a model that executes each request
alone one free instance takes in one EXECUTE, and the cost average it is sized from."""

from __future__ import annotations

import pytest

from zinfer.broker.batching.runs import (
    RUN_BUDGET_NS,
    RUN_MAX,
    ExecutionCost,
    run_length,
    run_targets,
    split_runs,
)

US = 1_000


@pytest.mark.parametrize(
    ("queued", "places", "cost_ns", "want"),
    [
        (40, 2, 50 * US, RUN_MAX),  # cheap executions: the cap
        (40, 2, 0.0, 1),  # nothing timed yet: each request alone
        (2, 2, 50 * US, 1),  # no backlog: alone, as before
        (1, 2, 50 * US, 1),
        (9, 2, 50 * US, 5),  # the even share, rounded up
        (40, 2, RUN_BUDGET_NS / 4, 4),  # the budget
        (40, 2, RUN_BUDGET_NS * 3, 1),  # one execution past the budget: alone
        (40, 0, 50 * US, 1),  # no free place
    ],
)
def test_run_length(queued: int, places: int, cost_ns: float, want: int) -> None:
    assert run_length(queued, places, cost_ns) == want


def test_a_run_never_holds_more_than_the_budget_of_computing() -> None:
    for cost in (1 * US, 7 * US, 60 * US, 333 * US, 999 * US):
        n = run_length(10_000, 1, cost)
        assert 1 <= n <= RUN_MAX and (n == 1 or n * cost <= RUN_BUDGET_NS)


def test_split_runs_keeps_the_order_and_every_item() -> None:
    assert split_runs([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert split_runs([1, 2], 5) == [[1, 2]]
    assert split_runs([], 3) == []
    assert split_runs([1, 2], 0) == [[1], [2]]


def test_the_cost_starts_at_the_first_execution_and_follows_later_ones() -> None:
    cost = ExecutionCost()
    assert cost.ns == 0.0
    cost.observe(400 * US, 4)  # a run of four: 100 us each
    assert cost.ns == pytest.approx(100 * US)
    for _ in range(40):
        cost.observe(10_000 * US, 1)  # the model got slow: the average follows
    assert cost.ns == pytest.approx(10_000 * US, rel=0.01)
    before = cost.ns
    cost.observe(5, 0)  # nothing executed
    cost.observe(-1, 1)  # a clock that went back
    assert cost.ns == before


def test_runs_go_to_instances_running_nothing_first() -> None:
    assert run_targets([b"a", b"b", b"a", b"b"]) == [b"a", b"b"]  # both free: both take runs
    assert run_targets([b"b", b"a", b"b"]) == [b"b"]  # a is busy: b, which runs nothing, takes the backlog
    assert run_targets([b"a", b"b"]) == [b"a", b"b"]  # both busy: their second places, in line
    assert run_targets([]) == []
