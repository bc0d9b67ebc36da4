"""``max_queue_delay_microseconds`` as an upper bound (``batching.early_dispatch``): a batch that no companion
is due for goes at once; never later than the delay; under load, batches form exactly as Triton's timing
forms them; ``zinfer_early_dispatch: "false"`` keeps Triton's timing."""

from __future__ import annotations

import random

import pytest

from zinfer.broker.batching.batch_policy import BatchPolicy, BatchReason, QueuedRequest
from zinfer.broker.batching.batcher import DynamicBatcher
from zinfer.broker.batching.early_dispatch import COMPANION_ROWS, EarlyDispatch
from zinfer.broker.batching.simulate import ExecModel, SimRequest, poisson_arrivals, simulate
from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.parameters import check_parameters

DELAY_US = 500
DELAY_S = DELAY_US / 1e6


def _policy(early: bool, preferred: tuple[int, ...] = (4, 8), delay_us: int = DELAY_US) -> BatchPolicy:
    return BatchPolicy(8, preferred, max_queue_delay_us=delay_us, early_dispatch=early)


def _closed_loop(
    batcher: DynamicBatcher[int], count: int, service_s: float
) -> list[tuple[float, float, str]]:
    """One client calling in a loop: each request arrives ``service_s`` after the last one was sent. Returns
    (arrival, dispatch time, reason) per request, waking at ``next_deadline`` as the broker does."""
    out = []
    t = 0.0
    for i in range(count):
        batcher.add(QueuedRequest(i, 1, "k", t), t, busy=False)
        batches = batcher.pop_ready(t, 1)
        sent = t
        if not batches:
            deadline = batcher.next_deadline()
            assert deadline is not None and deadline > t
            sent = deadline
            batches = batcher.pop_ready(sent, 1)
        assert [b.items for b in batches] == [(i,)]
        out.append((t, sent, batches[0].reason.value))
        t = sent + service_s
    return out


def test_a_single_client_in_a_loop_is_dispatched_at_once_after_a_few_requests() -> None:
    runs = _closed_loop(DynamicBatcher(_policy(True)), 50, service_s=300e-6)
    waits = [sent - arrival for arrival, sent, _ in runs]
    assert waits[0] == pytest.approx(DELAY_S)  # no rate seen yet: Triton's timing
    assert all(w == 0 for w in waits[10:])
    assert {r for _, _, r in runs[10:]} == {BatchReason.EARLY_NO_COMPANION.value}


def test_without_early_dispatch_every_request_of_the_loop_waits_the_whole_delay() -> None:
    runs = _closed_loop(DynamicBatcher(_policy(False)), 20, service_s=300e-6)
    assert all(sent - arrival == pytest.approx(DELAY_S) for arrival, sent, _ in runs)
    assert {r for _, _, r in runs} == {BatchReason.DELAY_EXPIRED.value}


@pytest.mark.parametrize("seed", range(5))
def test_no_request_waits_longer_than_the_delay(seed: int) -> None:
    """Random arrivals, random instance business, with an injected clock: every batch leaves by its oldest
    request's arrival plus the delay, and whenever it leaves before, the reason says why."""
    rng = random.Random(seed)
    batcher: DynamicBatcher[int] = DynamicBatcher(_policy(True, preferred=(3, 6)))
    arrivals: dict[int, float] = {}
    t, i = 0.0, 0
    for _ in range(2000):
        t += rng.expovariate(rng.choice([200.0, 2000.0, 20000.0]))
        deadline = batcher.next_deadline()
        if deadline is not None and deadline <= t:  # the loop wakes at the deadline first
            for b in batcher.pop_ready(deadline, 1):
                oldest = min(arrivals[x] for x in b.items)
                assert deadline <= oldest + DELAY_S + 1e-12
        arrivals[i] = t
        batcher.add(QueuedRequest(i, 1, "k", t), t, busy=rng.random() < 0.3)
        i += 1
        for b in batcher.pop_ready(t, rng.choice([0, 1, 1])):
            oldest = min(arrivals[x] for x in b.items)
            assert t <= oldest + DELAY_S + 1e-12
            if t < oldest + DELAY_S and len(b.items) < 3:
                assert b.reason in (BatchReason.EARLY_NO_COMPANION, BatchReason.MAX_SIZE)


@pytest.mark.parametrize(
    ("gap_us", "preferred"),
    [(100, (4, 8)), (60, (8,)), (120, (4,)), (45, (2, 4, 8)), (249, (2,))],
)
def test_under_load_batches_form_as_with_tritons_timing(gap_us: int, preferred: tuple[int, ...]) -> None:
    """Arrivals every ``gap_us`` reach a preferred size within the delay: the batches (sizes, reasons, when
    each request left) are the same with and without early dispatch."""
    reqs = [SimRequest(k * gap_us / 1e6) for k in range(400)]
    model = ExecModel(fixed_s=200e-6, per_item_s=10e-6)
    on = simulate(_policy(True, preferred), reqs, model)
    off = simulate(_policy(False, preferred), reqs, model)
    assert on.batch_sizes == off.batch_sizes
    assert on.reasons == off.reasons
    assert on.queue_waits == off.queue_waits
    assert max(off.batch_sizes) > 1  # the load does batch


def test_under_poisson_load_nothing_is_sent_early() -> None:
    """Open-loop arrivals that bring companions within the delay: early dispatch never fires, and the
    batches are those of Triton's timing."""
    reqs = poisson_arrivals(20_000.0, 3000, seed=3)
    model = ExecModel(fixed_s=300e-6, per_item_s=5e-6)
    on = simulate(_policy(True), reqs, model)
    off = simulate(_policy(False), reqs, model)
    assert on.reasons[BatchReason.EARLY_NO_COMPANION.value] == 0
    assert on.batch_sizes == off.batch_sizes


def test_light_open_load_goes_early_and_sooner() -> None:
    """Arrivals far apart (100/s against a 500 us delay): batches go at once, so requests wait less."""
    reqs = poisson_arrivals(100.0, 300, seed=4)
    model = ExecModel(fixed_s=100e-6, per_item_s=5e-6)
    on = simulate(_policy(True), reqs, model)
    off = simulate(_policy(False), reqs, model)
    assert on.reasons[BatchReason.EARLY_NO_COMPANION.value] > 250
    assert on.p50 < off.p50 - 300e-6


def test_a_preferred_size_still_sends_at_once_and_is_not_called_early() -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(_policy(True, preferred=(2,)))
    batcher.add(QueuedRequest(0, 1, "k", 0.0), 0.0)
    batcher.add(QueuedRequest(1, 1, "k", 10e-6), 10e-6)  # overlaps the first: companions do come
    [batch] = batcher.pop_ready(10e-6, 1)
    assert batch.reason == BatchReason.PREFERRED and batch.items == (0, 1)


def test_the_decision_follows_the_companion_rate() -> None:
    early = EarlyDispatch(DELAY_S)
    assert not early.early and early.send_at(1.0) == pytest.approx(1.0 + DELAY_S)  # nothing seen yet
    t = 0.0
    for _ in range(100):  # 10 000/s, every one found another queued or running
        t += 100e-6
        early.observe(t, 1, overlapping=True)
    assert early.companion_rate() == pytest.approx(10_000, rel=0.01)
    assert not early.early and early.send_at(t) == pytest.approx(t + DELAY_S)
    for _ in range(200):  # the same rate, none overlapping: one caller at a time
        t += 100e-6
        early.observe(t, 1, overlapping=False)
    assert early.companion_rate() * DELAY_S < COMPANION_ROWS
    assert early.early and early.send_at(t) == t


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        EarlyDispatch(-1.0)
    with pytest.raises(ValueError, match="early_dispatch must be a bool"):
        BatchPolicy(8, early_dispatch="yes")  # type: ignore[arg-type]


CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


@pytest.mark.parametrize(
    ("value", "want"), [(None, True), ("false", False), ("true", True), (" FALSE ", False)]
)
def test_the_model_parameter_turns_it_off(value: str | None, want: bool) -> None:
    text = CONFIG
    if value is not None:
        text += f'parameters {{ key: "zinfer_early_dispatch" value: {{ string_value: "{value}" }} }}\n'
    config = parse_model_config(text, source="config.pbtxt", model_name="m")
    check_parameters(config)
    assert BatchPolicy.from_config(config).early_dispatch is want


def test_a_bad_parameter_value_is_a_config_error() -> None:
    text = CONFIG + 'parameters { key: "zinfer_early_dispatch" value: { string_value: "maybe" } }\n'
    want = r"zinfer_early_dispatch must be \"true\" or \"false\" \(or 1/0, yes/no, on/off\), got 'maybe'"
    with pytest.raises(ConfigError, match=want):
        check_parameters(parse_model_config(text, source="config.pbtxt", model_name="m"))
