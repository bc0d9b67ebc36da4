"""Table tests and a virtual-time simulation for the pure dynamic batcher."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from zinfer.broker.batching.batcher import Batch, BatchPolicy, BatchReason, DynamicBatcher, QueuedRequest
from zinfer.broker.batching.simulate import ExecModel, SimRequest, poisson_arrivals, simulate

R = BatchReason
MS = 1e-3

Arrival = tuple[int, Hashable, float]  # (batch_size, shape_key, arrival seconds)


def ones(n: int, key: Hashable = "a", t: float = 0.0) -> list[Arrival]:
    return [(1, key, t)] * n


def make(policy: BatchPolicy, arrivals: list[Arrival]) -> DynamicBatcher[int]:
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    for i, (size, key, t) in enumerate(arrivals):
        batcher.add(QueuedRequest(item=i, batch_size=size, shape_key=key, arrival=t), now=t)
    return batcher


def simplify(batches: list[Batch[int]]) -> list[tuple[list[int], BatchReason]]:
    return [(list(b.items), b.reason) for b in batches]


@dataclass(frozen=True)
class Case:
    policy: BatchPolicy
    arrivals: list[Arrival]
    now: float
    free: int
    expected: list[tuple[list[int], BatchReason]]
    deadline: float | None


CASES = {
    "no_batching_one_per_instance": Case(
        BatchPolicy(0, max_queue_delay_us=1000),
        ones(3),
        0.0,
        2,
        [([0], R.NO_BATCHING), ([1], R.NO_BATCHING)],
        None,
    ),
    "no_batching_ignores_rows_and_shapes": Case(
        BatchPolicy(0),
        [(5, "a", 0.0), (1, "b", 0.0)],
        0.0,
        4,
        [([0], R.NO_BATCHING), ([1], R.NO_BATCHING)],
        None,
    ),
    "preferred_largest_reachable": Case(
        BatchPolicy(16, (4, 8), 1000), ones(9), 0.0, 1, [(list(range(8)), R.PREFERRED)], 1 * MS
    ),
    "preferred_smaller_when_larger_unreachable": Case(
        BatchPolicy(16, (4, 8), 1000), ones(6), 0.0, 1, [([0, 1, 2, 3], R.PREFERRED)], 1 * MS
    ),
    "default_preferred_is_max_and_reports_full": Case(
        BatchPolicy(4), ones(5), 0.0, 1, [([0, 1, 2, 3], R.MAX_SIZE)], None
    ),
    "below_preferred_waits_for_delay": Case(BatchPolicy(8, (), 1000), ones(3), 0.0, 1, [], 1 * MS),
    "max_size_cut_by_next_request": Case(
        BatchPolicy(8, (), 1000),
        [(3, "a", 0.0), (3, "a", 0.0), (3, "a", 0.1 * MS)],
        0.1 * MS,
        1,
        [([0, 1], R.MAX_SIZE)],
        1.1 * MS,
    ),
    "saturated_past_largest_preferred": Case(
        BatchPolicy(8, (4, 6), 1000),
        [(3, "a", 0.0), (2, "a", 0.0), (2, "a", 0.0)],
        0.0,
        1,
        [([0, 1], R.MAX_SIZE)],
        1 * MS,
    ),
    "first_request_above_largest_preferred_goes_alone": Case(
        BatchPolicy(8, (2,), 1000),
        [(3, "a", 0.0), (1, "a", 0.2 * MS)],
        0.2 * MS,
        2,
        [([0], R.MAX_SIZE)],
        1.2 * MS,
    ),
    "shape_cut_never_skips": Case(
        BatchPolicy(8, (), 1000),
        [(1, "a", 0.0), (1, "a", 0.0), (1, "b", 0.1 * MS), (1, "a", 0.1 * MS)],
        0.1 * MS,
        3,
        [([0, 1], R.SHAPE_CUT), ([2], R.SHAPE_CUT)],
        1.1 * MS,
    ),
    "shape_cut_then_opportunistic_remainder": Case(
        BatchPolicy(8),
        [(1, "a", 0.0), (1, "a", 0.0), (1, "b", 0.0)],
        0.0,
        2,
        [([0, 1], R.SHAPE_CUT), ([2], R.IDLE_NO_DELAY)],
        None,
    ),
    "request_rows_count_toward_preferred": Case(
        BatchPolicy(8, (4,), 1000),
        [(2, "a", 0.0), (2, "a", 0.0), (1, "a", 0.0)],
        0.0,
        1,
        [([0, 1], R.PREFERRED)],
        1 * MS,
    ),
    "request_rows_count_toward_max": Case(
        BatchPolicy(8, (), 1000),
        [(5, "a", 0.0), (4, "a", 0.0)],
        0.0,
        2,
        [([0], R.MAX_SIZE)],
        1 * MS,
    ),
    "delay_not_yet_reached": Case(
        BatchPolicy(8, (), 1000), [(1, "a", 0.0), (1, "a", 0.9 * MS)], 0.9 * MS, 1, [], 1 * MS
    ),
    "delay_measured_from_oldest_request": Case(
        BatchPolicy(8, (), 1000),
        [(1, "a", 0.0), (1, "a", 0.9 * MS)],
        1 * MS,
        1,
        [([0, 1], R.DELAY_EXPIRED)],
        None,
    ),
    "delay_expired_sends_past_preferred": Case(
        BatchPolicy(16, (4,), 1000),
        [*ones(6), (1, "b", 0.0)],
        2 * MS,
        1,
        [(list(range(6)), R.SHAPE_CUT)],
        0.001,
    ),
    "delay_expired_remainder_also_goes": Case(
        BatchPolicy(4, (), 1000),
        ones(6),
        2 * MS,
        2,
        [([0, 1, 2, 3], R.MAX_SIZE), ([4, 5], R.DELAY_EXPIRED)],
        None,
    ),
    "delay_zero_is_opportunistic": Case(
        BatchPolicy(8), ones(3), 0.0, 1, [([0, 1, 2], R.IDLE_NO_DELAY)], None
    ),
    "delay_zero_still_prefers_preferred": Case(
        BatchPolicy(8, (4,)), ones(6), 0.0, 2, [([0, 1, 2, 3], R.PREFERRED), ([4, 5], R.IDLE_NO_DELAY)], None
    ),
    "no_free_instance_sends_nothing": Case(BatchPolicy(4), ones(6), 5.0, 0, [], None),
    "no_free_instance_keeps_deadline": Case(BatchPolicy(4, (), 1000), ones(2), 5.0, 0, [], 1 * MS),
    "multiple_instances_full_batches": Case(
        BatchPolicy(4, (), 1000),
        ones(9),
        0.0,
        3,
        [([0, 1, 2, 3], R.MAX_SIZE), ([4, 5, 6, 7], R.MAX_SIZE)],
        1 * MS,
    ),
    "multiple_instances_remainder_waits": Case(
        BatchPolicy(8, (2, 4), 1000),
        ones(7),
        0.0,
        4,
        [([0, 1, 2, 3], R.PREFERRED), ([4, 5], R.PREFERRED)],
        1 * MS,
    ),
    "empty_queue": Case(BatchPolicy(8, (), 1000), [], 0.0, 4, [], None),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_batch_table(case: Case) -> None:
    batcher = make(case.policy, case.arrivals)
    batches = batcher.pop_ready(case.now, case.free)
    assert simplify(batches) == case.expected
    for batch in batches:
        assert batch.size == sum(case.arrivals[i][0] for i in batch.items)
    sent = sum(len(b.items) for b in batches)
    assert len(batcher) == len(case.arrivals) - sent
    assert batcher.queued_batch_size == sum(a[0] for a in case.arrivals) - sum(b.size for b in batches)
    deadline = batcher.next_deadline()
    if case.deadline is None:
        assert deadline is None
    else:
        assert deadline == pytest.approx(case.deadline)


@pytest.mark.parametrize("delay_us", [0, 1000])
def test_queue_grows_while_no_instance_is_free(delay_us: int) -> None:
    batcher = make(BatchPolicy(16, (), delay_us), [(1, "a", 0.0), (2, "a", 0.1 * MS), (1, "a", 0.2 * MS)])
    assert batcher.pop_ready(0.2 * MS, 0) == []
    for i, t in enumerate([0.3 * MS, 0.4 * MS], start=3):
        batcher.add(QueuedRequest(item=i, batch_size=3, shape_key="a", arrival=t), now=t)
        assert batcher.pop_ready(t, 0) == []
    assert (len(batcher), batcher.queued_batch_size) == (5, 10)
    batches = batcher.pop_ready(2 * MS, 1)
    reason = R.IDLE_NO_DELAY if delay_us == 0 else R.DELAY_EXPIRED
    assert simplify(batches) == [([0, 1, 2, 3, 4], reason)]
    assert batches[0].size == 10
    assert len(batcher) == 0 and batcher.queued_batch_size == 0


def test_pop_at_next_deadline_fires() -> None:
    # Awkward float values: now == next_deadline() must count as "delay exceeded".
    batcher = make(BatchPolicy(8, (), 100), [(1, "a", 0.1), (1, "a", 0.10003)])
    deadline = batcher.next_deadline()
    assert deadline is not None
    assert batcher.pop_ready(deadline - 1e-9, 1) == []
    assert simplify(batcher.pop_ready(deadline, 1)) == [([0, 1], R.DELAY_EXPIRED)]


def test_remove_drops_matching_items() -> None:
    batcher = make(
        BatchPolicy(8, (), 1000), [(2, "a", 0.0), (1, "a", 0.5 * MS), (3, "b", 0.6 * MS), (1, "a", 0.7 * MS)]
    )
    assert batcher.remove(lambda item: item in (0, 2)) == [0, 2]
    assert (len(batcher), batcher.queued_batch_size) == (2, 2)
    assert batcher.next_deadline() == pytest.approx(1.5 * MS)
    assert batcher.remove(lambda item: False) == []
    assert simplify(batcher.pop_ready(1.5 * MS, 1)) == [([1, 3], R.DELAY_EXPIRED)]
    assert batcher.remove(lambda item: True) == []


def test_policy_normalises_preferred_sizes() -> None:
    assert BatchPolicy(8).preferred_batch_sizes == (8,)
    assert BatchPolicy(8, (4, 2, 4)).preferred_batch_sizes == (2, 4)
    assert BatchPolicy(0).preferred_batch_sizes == ()
    assert BatchPolicy(8, (2, 4)) == BatchPolicy(8, (4, 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"max_batch_size": 1.5}, "max_batch_size"),
        ({"max_batch_size": 8, "max_queue_delay_us": -5}, "max_queue_delay_us"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (0,)}, "outside"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (4, 9)}, "outside"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (-1,)}, "preferred_batch_sizes"),
        ({"max_batch_size": 8, "preferred_batch_sizes": 4}, "tuple"),
        ({"max_batch_size": 0, "preferred_batch_sizes": (1,)}, "no batching"),
    ],
)
def test_invalid_policy_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("max_batch_size", "batch_size"), [(8, 0), (8, 9), (8, -1), (0, 0), (4, True)])
def test_invalid_add_raises(max_batch_size: int, batch_size: int) -> None:
    batcher: DynamicBatcher[str] = DynamicBatcher(BatchPolicy(max_batch_size))
    with pytest.raises(ValueError, match="batch_size"):
        batcher.add(QueuedRequest(item="x", batch_size=batch_size, shape_key="a", arrival=0.0), now=0.0)
    assert len(batcher) == 0 and batcher.queued_batch_size == 0


def test_negative_free_instances_raises() -> None:
    with pytest.raises(ValueError, match="free_instances"):
        make(BatchPolicy(4), ones(1)).pop_ready(0.0, -1)


@pytest.mark.parametrize("seed", range(15))
def test_simulation_invariants(seed: int) -> None:
    rng = random.Random(seed)
    max_size = [0, 1, 4, 8, 16][seed % 5]  # 15 seeds cover every (max_size, delay) pair
    preferred: tuple[int, ...] = ()
    if max_size > 1 and rng.random() < 0.5:
        preferred = tuple(rng.sample(range(1, max_size + 1), k=rng.randint(1, 3)))
    delay_s = [0, 200, 2000][seed % 3] * 1e-6
    policy = BatchPolicy(max_size, preferred, round(delay_s * 1e6))
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    n_instances = rng.randint(1, 3)
    keys = ["a", "b"] if rng.random() < 0.5 else ["a"]

    # Requests: (rows, key, arrival) with exponential inter-arrival times.
    requests: list[Arrival] = []
    t = 0.0
    for _ in range(300):
        t += rng.expovariate(1 / (0.3 * MS))
        rows = rng.randint(1, max(1, min(max_size, 3)))
        requests.append((rows, rng.choice(keys), t))

    busy_until = [0.0] * n_instances
    sent: list[int] = []
    now, nxt = 0.0, 0
    for _ in range(10_000):
        while nxt < len(requests) and requests[nxt][2] <= now:
            rows, key, arrival = requests[nxt]
            batcher.add(QueuedRequest(item=nxt, batch_size=rows, shape_key=key, arrival=arrival), now=now)
            nxt += 1
        free = [i for i, b in enumerate(busy_until) if b <= now]
        batches = batcher.pop_ready(now, len(free))
        assert len(batches) <= len(free)
        for inst, batch in zip(free, batches, strict=False):
            assert len({requests[i][1] for i in batch.items}) == 1, "mixed shape keys"
            assert batch.size == sum(requests[i][0] for i in batch.items)
            assert max_size == 0 or batch.size <= max_size
            assert max_size != 0 or len(batch.items) == 1
            sent.extend(batch.items)
            busy_until[inst] = now + (0.2 + 0.05 * batch.size) * MS
        if len(batches) < len(free) and len(batcher):
            # An instance stayed idle: only allowed while the oldest request is within its delay.
            deadline = batcher.next_deadline()
            assert deadline is not None and now < deadline
        if nxt == len(requests) and not len(batcher):
            break
        candidates = [b for b in busy_until if b > now]
        if nxt < len(requests):
            candidates.append(requests[nxt][2])
        deadline = batcher.next_deadline()
        if deadline is not None and deadline > now:
            candidates.append(deadline)
        now = min(candidates)
    else:
        pytest.fail("simulation did not drain")

    assert sent == list(range(len(requests))), "lost, duplicated or reordered requests"
    assert len(batcher) == 0 and batcher.queued_batch_size == 0


def test_queued_request_new_fields_default() -> None:
    req = QueuedRequest("x", 2, "k", 1.5)  # the broker's positional form
    assert (req.priority, req.timeout_us) == (0, 0)
    assert QueuedRequest("x", 2, "k", 1.5, 1, 300).timeout_us == 300


def test_stats_snapshot() -> None:
    batcher = make(BatchPolicy(8, (), 1000), [(2, "a", 0.0), (1, "a", 0.0)])
    stats = batcher.stats()
    assert (stats.queued, stats.queued_rows, stats.level_sizes) == (2, 3, (2,))
    assert (stats.rejected_timeouts, stats.delayed_timeouts, stats.rejected_queue_full) == (0, 0, 0)
    assert stats.adaptive is None


@pytest.mark.parametrize("seed", range(10))
def test_simulation_keeps_fifo_in_every_mode(seed: int) -> None:
    rng = random.Random(seed)
    max_size = rng.choice([1, 4, 16])
    policy = BatchPolicy(
        max_size,
        tuple(rng.sample(range(1, max_size + 1), k=1)) if rng.random() < 0.3 else (),
        rng.choice([0, 300]),
        latency_target_us=rng.choice([0, 3000, 20_000]),
    )
    reqs = [
        SimRequest(t, rng.randint(1, max_size), shape_key=rng.choice("aab"))
        for t in poisson_arrivals(rng.choice([500.0, 3000.0]), 300, seed)
    ]
    result = simulate(policy, reqs, ExecModel(0.3 * MS, 0.05 * MS))
    assert list(result.completed) == list(range(len(reqs))), "lost, duplicated or reordered requests"
    assert all(size <= max_size for size in result.batch_sizes)
    assert result.stats.queued == 0
