"""Priorities and queue policies of the dynamic batcher, as Triton defines them (triton-features.md §1.2)."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from zinfer.broker.batching.batcher import (
    BatchPolicy,
    BatchReason,
    DynamicBatcher,
    InvalidPriority,
    QueuedRequest,
    QueueFull,
)
from zinfer.broker.batching.simulate import ExecModel, SimRequest, simulate
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.scheduling import QueuePolicy, TimeoutAction

R = BatchReason
MS = 1e-3
REJECT, DELAY = TimeoutAction.REJECT, TimeoutAction.DELAY
NO_LIMITS = QueuePolicy()


@dataclass(frozen=True)
class Req:
    priority: int = 0
    at: float = 0.0
    timeout_us: int = 0
    rows: int = 1
    key: Hashable = "a"


def make(policy: BatchPolicy, reqs: list[Req]) -> DynamicBatcher[int]:
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    for i, r in enumerate(reqs):
        batcher.add(QueuedRequest(i, r.rows, r.key, r.at, r.priority, r.timeout_us), now=r.at)
    return batcher


def pol(
    levels: int = 0,
    default: int = 0,
    per_level: dict[int, QueuePolicy] | None = None,
    queue: QueuePolicy = NO_LIMITS,
    max_batch_size: int = 8,
    delay_us: int = 0,
) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size,
        max_queue_delay_us=delay_us,
        priority_levels=levels,
        default_priority_level=default or (1 if levels else 0),
        default_queue_policy=queue,
        priority_queue_policy=per_level or {},
    )


def order(batcher: DynamicBatcher[int], now: float = 1e9) -> list[int]:
    """Every queued item in service order (drains the batcher)."""
    out: list[int] = []
    while len(batcher):
        out.extend(i for b in batcher.pop_ready(now, 1) for i in b.items)
    return out


# ----------------------------------------------------------------------------------------- priorities


@dataclass(frozen=True)
class OrderCase:
    policy: BatchPolicy
    reqs: list[Req]
    expected: list[int]


ORDER_CASES = {
    "one_queue_is_fifo": OrderCase(BatchPolicy(8), [Req(), Req(), Req()], [0, 1, 2]),
    "level_1_first_fifo_within": OrderCase(
        pol(3, 2),
        [Req(3), Req(0), Req(1), Req(2), Req(1)],
        [2, 4, 1, 3, 0],
    ),
    "priority_0_is_default_level": OrderCase(
        pol(2, 2),
        [Req(2), Req(0), Req(1), Req(0)],
        [2, 0, 1, 3],
    ),
    "default_level_1_goes_first": OrderCase(
        pol(2, 1),
        [Req(2), Req(0), Req(1)],
        [1, 2, 0],
    ),
}


@pytest.mark.parametrize("case", list(ORDER_CASES.values()), ids=list(ORDER_CASES))
def test_service_order(case: OrderCase) -> None:
    batcher = make(case.policy, case.reqs)
    assert batcher.stats().queued == len(case.reqs)
    batches = batcher.pop_ready(0.0, 1)
    assert [list(b.items) for b in batches] == [case.expected]


def test_levels_counted_separately() -> None:
    batcher = make(pol(3, 2), [Req(3), Req(0), Req(1), Req(3)])
    assert batcher.stats().level_sizes == (1, 1, 2)


def test_shape_cut_across_levels_never_skips() -> None:
    # Head-of-line cut also holds in priority order: a level-1 request of another shape ends the batch.
    batcher = make(
        pol(2, 2),
        [Req(2, key="a"), Req(1, key="a"), Req(1, key="b"), Req(2, key="a")],
    )
    got = [(list(b.items), b.reason) for b in batcher.pop_ready(0.0, 3)]
    assert got == [([1], R.SHAPE_CUT), ([2], R.SHAPE_CUT), ([0, 3], R.IDLE_NO_DELAY)]


def test_delay_runs_from_oldest_walked_request() -> None:
    # A fresh level-1 request and an old level-2 one form one batch; the level-2 request's age counts.
    batcher = make(pol(2, 2, delay_us=1000), [Req(2, at=0.0), Req(1, at=0.9 * MS)])
    assert batcher.next_deadline() == pytest.approx(1 * MS)
    assert batcher.pop_ready(0.95 * MS, 1) == []
    assert [list(b.items) for b in batcher.pop_ready(1 * MS, 1)] == [[1, 0]]


@pytest.mark.parametrize(
    ("policy", "priority"),
    [
        (pol(), 1),  # no priority levels: only 0 (the default) is valid
        (pol(2), 3),
        (pol(2), -1),
        (pol(2), True),
        (pol(1, max_batch_size=0), 2),
    ],
)
def test_priority_out_of_range_is_an_error(policy: BatchPolicy, priority: int) -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    with pytest.raises(InvalidPriority, match="priority"):
        batcher.add(QueuedRequest(0, 1, "a", 0.0, priority=priority), 0.0)
    assert len(batcher) == 0 and batcher.queued_batch_size == 0
    assert issubclass(InvalidPriority, ValueError)


@pytest.mark.parametrize("timeout_us", [-1, True, 1.5])
def test_bad_request_timeout_is_an_error(timeout_us: int) -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(BatchPolicy(8))
    with pytest.raises(ValueError, match="timeout_us"):
        batcher.add(QueuedRequest(0, 1, "a", 0.0, timeout_us=timeout_us), 0.0)
    assert len(batcher) == 0


# ----------------------------------------------------------------------------------------- max_queue_size


def test_max_queue_size_one_queue() -> None:
    batcher = make(BatchPolicy(8, default_queue_policy=QueuePolicy(max_queue_size=2)), [Req(), Req()])
    with pytest.raises(QueueFull, match="Exceeds maximum queue size"):
        batcher.add(QueuedRequest(2, 1, "a", 0.0), 0.0)
    assert len(batcher) == 2 and batcher.stats().rejected_queue_full == 1
    assert issubclass(QueueFull, ValueError)
    assert len(batcher.pop_ready(0.0, 1)) == 1
    batcher.add(QueuedRequest(3, 1, "a", 0.0), 0.0)  # room again once a batch left
    batcher.add(QueuedRequest(4, 1, "a", 0.0), 0.0)
    with pytest.raises(QueueFull):
        batcher.add(QueuedRequest(5, 1, "a", 0.0), 0.0)


def test_max_queue_size_per_level_counts_requests_not_rows() -> None:
    policy = pol(2, 2, {1: QueuePolicy(max_queue_size=1)})
    batcher = make(policy, [Req(1, rows=4), Req(2), Req(0), Req(0)])  # level 2 is unbounded
    with pytest.raises(QueueFull, match=r"Exceeds maximum queue size.*level 1.*max 1"):
        batcher.add(QueuedRequest(9, 1, "a", 0.0, priority=1), 0.0)
    assert batcher.stats().level_sizes == (1, 3)


def test_max_queue_size_counts_delayed_requests() -> None:
    policy = pol(queue=QueuePolicy(DELAY, 1000, max_queue_size=2), delay_us=20_000)
    batcher = make(policy, [Req(), Req(at=0.5 * MS)])
    assert batcher.expire(1.2 * MS) == []  # request 0 moved behind request 1
    assert batcher.stats().delayed_timeouts == 1
    with pytest.raises(QueueFull):
        batcher.add(QueuedRequest(2, 1, "a", 2 * MS), 2 * MS)


# ----------------------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize(
    ("default_us", "override", "request_us", "effective_us"),
    [
        (0, False, 0, None),
        (0, False, 500, None),  # no override allowed: the request's timeout is ignored
        (0, True, 500, 500),  # default 0 = none: the request's own timeout applies
        (0, True, 0, None),
        (1000, False, 0, 1000),
        (1000, False, 500, 1000),
        (1000, True, 500, 500),  # shorter: used
        (1000, True, 2000, 1000),  # longer: never
        (1000, True, 0, 1000),
    ],
)
def test_timeout_override_only_shortens(
    default_us: int, override: bool, request_us: int, effective_us: int | None
) -> None:
    policy = pol(queue=QueuePolicy(REJECT, default_us, override), delay_us=50_000)
    batcher = make(policy, [Req(at=1.0, timeout_us=request_us)])
    if effective_us is None:
        assert batcher.next_expiry() is None
        assert batcher.next_deadline() == pytest.approx(1.05)
        assert batcher.expire(100.0) == []
        return
    deadline = 1.0 + effective_us * 1e-6
    assert batcher.next_expiry() == pytest.approx(deadline)
    assert batcher.next_deadline() == pytest.approx(deadline)
    assert batcher.expire(deadline - 1e-7) == []
    assert batcher.expire(deadline) == [0]
    assert len(batcher) == 0 and batcher.queued_batch_size == 0 and batcher.next_deadline() is None


def test_per_level_policies() -> None:
    per_level = {2: QueuePolicy(REJECT, 3000), 3: QueuePolicy()}
    policy = pol(3, 3, per_level, QueuePolicy(REJECT, 1000), delay_us=50_000)
    assert policy.queue_policy(1) == QueuePolicy(REJECT, 1000)
    batcher = make(policy, [Req(1), Req(2), Req(3), Req(0)])
    assert batcher.next_expiry() == pytest.approx(1 * MS)
    assert batcher.expire(1 * MS) == [0]
    assert batcher.next_expiry() == pytest.approx(3 * MS)
    assert batcher.expire(10.0) == [1]
    assert batcher.next_expiry() is None and len(batcher) == 2
    assert batcher.stats().rejected_timeouts == 2


def test_reject_is_reported_promptly_while_no_instance_is_free() -> None:
    batcher = make(pol(queue=QueuePolicy(REJECT, 2000)), [Req(at=0.0), Req(at=1 * MS)])
    assert batcher.pop_ready(2 * MS, 0) == []
    assert batcher.expire(2 * MS) == [0]
    assert batcher.next_expiry() == pytest.approx(3 * MS)  # wake for request 1 even with no free instance


def test_pop_ready_never_batches_a_timed_out_request() -> None:
    batcher = make(
        pol(queue=QueuePolicy(REJECT, 2000, True)),
        [Req(at=0.0, timeout_us=500), Req(at=0.1 * MS), Req(at=0.2 * MS, timeout_us=100)],
    )
    batches = batcher.pop_ready(1 * MS, 1)
    assert [list(b.items) for b in batches] == [[1]]
    assert batcher.next_expiry() == pytest.approx(1 * MS)  # held rejects: call expire() now
    assert batcher.expire(1 * MS) == [0, 2]
    assert batcher.next_expiry() is None and batcher.expire(5.0) == []


def test_remove_also_returns_held_rejects() -> None:
    batcher = make(pol(queue=QueuePolicy(REJECT, 1000)), [Req(at=0.0), Req(at=1.5 * MS)])
    assert batcher.pop_ready(1 * MS, 0) == []
    assert batcher.remove(lambda _: True) == [0, 1]
    assert batcher.expire(10.0) == [] and batcher.next_expiry() is None


def test_delay_moves_behind_unexpired_requests_of_its_level() -> None:
    # Default 0 with override: only requests 0 and 2 carry timeouts.
    policy = pol(2, 1, queue=QueuePolicy(DELAY, 0, True), delay_us=50_000)
    reqs = [Req(1, 0.0, 1000), Req(1, 0.1 * MS), Req(2, 0.2 * MS, 500), Req(2, 0.3 * MS)]
    batcher = make(policy, reqs)
    assert batcher.expire(1 * MS) == []  # DELAY: nothing is failed
    assert batcher.stats().delayed_timeouts == 2
    assert batcher.next_expiry() is None  # a delayed request has no timeout any more
    batcher.add(QueuedRequest(4, 1, "a", 2 * MS, priority=1), 2 * MS)  # newer, still ahead of request 0
    assert order(batcher) == [1, 4, 0, 3, 2]


def test_delayed_request_may_wait_indefinitely() -> None:
    batcher = make(pol(queue=QueuePolicy(DELAY, 1000), max_batch_size=1), [Req(at=0.0)])
    assert batcher.pop_ready(1 * MS, 0) == []  # the instance is busy past request 0's timeout
    assert batcher.stats().delayed_timeouts == 1
    t = 1 * MS
    for i in range(1, 6):  # each newer request is served first while it is unexpired
        t += 0.5 * MS
        batcher.add(QueuedRequest(i, 1, "a", t), t)
        assert [b.items for b in batcher.pop_ready(t, 1)] == [(i,)]
    assert [b.items for b in batcher.pop_ready(t, 1)] == [(0,)]


def test_delayed_request_keeps_its_arrival_for_the_queue_delay() -> None:
    batcher = make(pol(queue=QueuePolicy(DELAY, 0, True), delay_us=5000), [Req(at=0.0, timeout_us=1000)])
    assert batcher.next_deadline() == pytest.approx(1 * MS)  # the timeout comes first
    assert batcher.pop_ready(1 * MS, 1) == []  # moved; the 5 ms queue delay has not passed
    assert batcher.next_deadline() == pytest.approx(5 * MS)
    assert [b.reason for b in batcher.pop_ready(5 * MS, 1)] == [R.DELAY_EXPIRED]


@pytest.mark.parametrize(
    ("delay_us", "timeout_us", "deadline"),
    [(10_000, 2000, 2 * MS), (1000, 2000, 1 * MS), (0, 2000, 2 * MS), (0, 0, None)],
)
def test_next_deadline_includes_timeouts(delay_us: int, timeout_us: int, deadline: float | None) -> None:
    batcher = make(pol(queue=QueuePolicy(REJECT, timeout_us), delay_us=delay_us), [Req()])
    got = batcher.next_deadline()
    assert got == pytest.approx(deadline) if deadline is not None else got is None


# ----------------------------------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"priority_levels": 2}, "default_priority_level must be in"),
        ({"priority_levels": 2, "default_priority_level": 3}, "default_priority_level must be in"),
        ({"default_priority_level": 1}, "without priority levels"),
        ({"priority_levels": -1}, "priority_levels"),
        (
            {"priority_levels": 1, "default_priority_level": 1, "priority_queue_policy": {2: QueuePolicy()}},
            "level 2",
        ),
        (
            {"priority_levels": 1, "default_priority_level": 1, "priority_queue_policy": {1: "x"}},
            "QueuePolicy",
        ),
        ({"default_queue_policy": QueuePolicy(REJECT, -1)}, "default_timeout_microseconds"),
        ({"default_queue_policy": QueuePolicy(max_queue_size=-2)}, "max_queue_size"),
        ({"latency_target_us": -1}, "latency_target_us"),
        ({"instances": 0}, "instances"),
    ],
)
def test_invalid_priority_policy_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchPolicy(8, **kwargs)  # type: ignore[arg-type]


CONFIG = """
max_batch_size: 8
dynamic_batching {
  preferred_batch_size: [ 4 ]
  max_queue_delay_microseconds: 300
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true
  }
  priority_queue_policy { key: 1 value { max_queue_size: 3 } }
  zinfer_latency_target_microseconds: 7000
}
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]
"""


def test_policy_from_config() -> None:
    policy = BatchPolicy.from_config(parse_model_config(CONFIG, source="c", model_name="m"))
    assert policy == BatchPolicy(
        8,
        (4,),
        300,
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(DELAY, 5000, True),
        priority_queue_policy={1: QueuePolicy(max_queue_size=3)},
        latency_target_us=7000,
        instances=3,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_batch_size: 4", BatchPolicy(4, (1,))),  # Triton's default scheduler: each request alone
        ("max_batch_size: 0", BatchPolicy(0)),
        ("max_batch_size: 0 dynamic_batching { }", BatchPolicy(0)),
        ("max_batch_size: 4 dynamic_batching { }", BatchPolicy(4, (4,))),
        (
            "max_batch_size: 4 dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
            BatchPolicy(4, default_queue_policy=QueuePolicy(max_queue_size=2)),
        ),
    ],
)
def test_policy_from_small_configs(text: str, expected: BatchPolicy) -> None:
    assert BatchPolicy.from_config(parse_model_config(text, source="c", model_name="m")) == expected
    assert (
        BatchPolicy.from_config(parse_model_config(text, source="c", model_name="m"), instances=2).instances
        == 2
    )


# ----------------------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("seed", range(12))
def test_simulation_accounts_for_every_request(seed: int) -> None:
    rng = random.Random(seed)
    n_levels = rng.choice([0, 1, 3])
    per_level = {
        lvl: QueuePolicy(
            rng.choice([REJECT, DELAY]), rng.choice([0, 300, 1500]), rng.random() < 0.5, rng.choice([0, 0, 2])
        )
        for lvl in range(1, n_levels + 1)
        if rng.random() < 0.6
    }
    policy = BatchPolicy(
        rng.choice([0, 4, 8]) if n_levels else 8,
        max_queue_delay_us=rng.choice([0, 200, 1000]),
        priority_levels=n_levels,
        default_priority_level=rng.randint(1, n_levels) if n_levels else 0,
        default_queue_policy=QueuePolicy(
            rng.choice([REJECT, DELAY]), rng.choice([0, 800]), True, rng.choice([0, 3])
        ),
        priority_queue_policy=per_level,
    )
    t, reqs = 0.0, []
    for _ in range(400):
        t += rng.expovariate(6000.0)
        reqs.append(
            SimRequest(
                t, 1, rng.randint(0, n_levels), rng.choice([0, 0, 200, 2000]), rng.choice(["a", "a", "b"])
            )
        )
    result = simulate(policy, reqs, ExecModel(0.4 * MS, 0.05 * MS), instances=rng.randint(1, 2))
    done, rejected = set(result.completed), set(result.rejected)
    assert len(result.completed) == len(done) and len(result.rejected) == len(rejected), "duplicates"
    assert done | rejected == set(range(len(reqs))) and not done & rejected, "lost requests"
    stats = result.stats
    assert stats.queued == 0 and stats.queued_rows == 0
    assert len(rejected) == stats.rejected_timeouts + stats.rejected_queue_full
    for i, wait in result.queue_waits.items():  # a REJECT request never waits past its timeout
        level = (reqs[i].priority or policy.default_priority_level) if n_levels else 0
        qp = policy.queue_policy(level)
        timeout = qp.default_timeout_microseconds
        if qp.allow_timeout_override and reqs[i].timeout_us and (not timeout or reqs[i].timeout_us < timeout):
            timeout = reqs[i].timeout_us
        if qp.timeout_action is REJECT and timeout:
            assert wait < timeout * 1e-6 + 1e-12
