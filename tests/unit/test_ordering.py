"""preserve_ordering: responses released in arrival order whatever order they complete in."""

from __future__ import annotations

import random

import pytest

from zinfer.broker.batching.ordering import ResponseOrder

Step = tuple[str, int, list[int]]  # (complete|drop, seq, seqs released)


@pytest.mark.parametrize(
    ("steps"),
    [
        pytest.param([("complete", 1, [1]), ("complete", 2, [2]), ("complete", 3, [3])], id="in_order"),
        pytest.param([("complete", 3, []), ("complete", 2, []), ("complete", 1, [1, 2, 3])], id="reversed"),
        pytest.param([("complete", 2, []), ("complete", 1, [1, 2]), ("complete", 3, [3])], id="swap"),
        pytest.param([("drop", 1, []), ("complete", 2, [2]), ("complete", 3, [3])], id="drop_head"),
        pytest.param([("complete", 3, []), ("complete", 2, []), ("drop", 1, [2, 3])], id="drop_releases"),
        pytest.param([("complete", 1, [1]), ("drop", 2, []), ("complete", 3, [3])], id="drop_middle"),
        pytest.param([("complete", 3, []), ("drop", 2, []), ("complete", 1, [1, 3])], id="drop_behind_head"),
        pytest.param([("drop", 3, []), ("drop", 2, []), ("drop", 1, [])], id="all_dropped"),
    ],
)
def test_release_order(steps: list[Step]) -> None:
    order: ResponseOrder[int, str] = ResponseOrder()
    for seq in (1, 2, 3):
        order.submit(seq)
    for action, seq, released in steps:
        out = order.complete(seq, f"r{seq}") if action == "complete" else order.drop(seq)
        assert out == [(s, f"r{s}") for s in released]
    assert len(order) == 0 and order.held == 0


def test_held_and_pending_counts() -> None:
    order: ResponseOrder[int, str] = ResponseOrder()
    for seq in (10, 20, 30):
        order.submit(seq)
    assert order.complete(30, "c") == [] and order.complete(20, "b") == []
    assert (len(order), order.held) == (3, 2)
    order.submit(40)  # submitted later: waits behind everything before it
    assert order.complete(40, "d") == []
    assert order.complete(10, "a") == [(10, "a"), (20, "b"), (30, "c"), (40, "d")]
    assert (len(order), order.held) == (0, 0)


def test_values_may_be_none() -> None:
    order: ResponseOrder[int, None] = ResponseOrder()
    order.submit(1)
    order.submit(2)
    assert order.complete(2, None) == []
    assert order.complete(1, None) == [(1, None), (2, None)]


def test_errors() -> None:
    order: ResponseOrder[int, str] = ResponseOrder()
    order.submit(1)
    with pytest.raises(ValueError, match="already submitted"):
        order.submit(1)
    with pytest.raises(KeyError, match="not submitted"):
        order.complete(2, "x")
    with pytest.raises(KeyError, match="not submitted"):
        order.drop(2)
    order.submit(2)
    assert order.complete(2, "b") == []
    with pytest.raises(KeyError, match="already completed or dropped"):
        order.complete(2, "again")
    order.drop(1)
    with pytest.raises(KeyError, match="not submitted"):  # released and forgotten
        order.complete(1, "late")


@pytest.mark.parametrize("seed", range(10))
def test_random_completion_order(seed: int) -> None:
    rng = random.Random(seed)
    order: ResponseOrder[int, int] = ResponseOrder()
    submitted = list(range(200))
    for seq in submitted:
        order.submit(seq)
    finish = submitted[:]
    rng.shuffle(finish)
    dropped = set(rng.sample(submitted, 30))
    released: list[int] = []
    for seq in finish:
        out = order.drop(seq) if seq in dropped else order.complete(seq, seq * 10)
        assert all(value == s * 10 for s, value in out)
        released.extend(s for s, _ in out)
    assert released == [s for s in submitted if s not in dropped]
    assert len(order) == 0
