"""LatencyWindow: a clock-injected sliding minute of latencies and batch sizes."""

from __future__ import annotations

import pytest

from zinfer.broker.latency_window import LatencyWindow, WindowStats


def test_empty_window_has_no_figures() -> None:
    w = LatencyWindow()
    assert w.stats(100.0) == WindowStats(rate=0.0, p99_s=None, mean_batch=None)
    assert w.count(100.0) == 0


def test_p99_is_within_one_bin_of_the_exact_value() -> None:
    w = LatencyWindow()
    for i in range(1, 101):  # 1 ms .. 100 ms
        w.record(1000.0 + i / 1000, i / 1000)
    p99 = w.p99(1000.5)
    assert p99 is not None and 0.099 <= p99 <= 0.099 * 1.05
    p50 = w.quantile(1000.5, 0.5)
    assert p50 is not None and 0.050 <= p50 <= 0.050 * 1.05


@pytest.mark.parametrize(
    ("latency_s", "expected_s"),
    [(0.0, 1e-6), (5e-7, 1e-6), (1e-6, 1e-6), (250e-6, 250e-6), (2.0, 2.0), (1e9, None)],
)
def test_single_latency_comes_back_as_its_bin_edge(latency_s: float, expected_s: float | None) -> None:
    w = LatencyWindow()
    w.record(10.0, latency_s)
    p = w.p99(10.0)
    assert p is not None
    if expected_s is None:  # past the last bin: clamped, still a finite figure
        assert p > 100.0
    else:
        assert expected_s <= p <= expected_s * 1.05 + 1e-12


# (events as (time, latency or None, batch size or None), query time, count, mean batch)
TABLE = [
    ([(0.5, 0.01, None)], 0.9, 1, None),
    ([(0.5, 0.01, 4), (1.2, None, 2)], 1.5, 1, 3.0),
    ([(0.5, 0.01, 4), (59.9, 0.01, 2)], 59.99, 2, 3.0),  # both inside the last 60 s
    ([(0.5, 0.01, 4), (59.9, 0.01, 2)], 60.0, 1, 2.0),  # second 0 left the window
    ([(0.5, 0.01, 4), (60.5, 0.01, 2)], 60.6, 1, 2.0),  # slot 0 reused: old second reset
    ([(0.5, 0.01, 4), (200.0, 0.02, None)], 200.0, 1, None),
    ([(10.0, 0.01, 1), (5.0, 0.01, 8)], 10.0, 2, 4.5),  # earlier, other slot: still counted
    ([(70.0, 0.01, 1), (10.0, 0.01, 8)], 70.0, 1, 1.0),  # older than the slot's second: dropped
    ([(10.0, 0.01, 1), (5.0, 0.01, 8), (10.5, 0.01, 3)], 10.9, 3, 4.0),  # back, then the current second
]


@pytest.mark.parametrize(("events", "now", "count", "mean_batch"), TABLE)
def test_window_table(
    events: list[tuple[float, float | None, int | None]], now: float, count: int, mean_batch: float | None
) -> None:
    w = LatencyWindow(seconds=60)
    for t, latency, size in events:
        if latency is not None:
            w.record(t, latency)
        if size is not None:
            w.batch(t, size)
    assert w.count(now) == count
    assert w.mean_batch(now) == mean_batch


def test_rate_over_the_window_and_at_startup() -> None:
    w = LatencyWindow(seconds=10, start=0.0)
    for i in range(100):
        w.record(i * 0.05, 0.001)  # 20 per second for 5 s
    assert w.rate(5.0) == pytest.approx(100 / 5.0)
    for i in range(100, 300):
        w.record(i * 0.05, 0.001)  # 20 per second up to t=15
    assert w.rate(14.99) == pytest.approx(w.count(14.99) / 9.99)
    assert w.rate(14.99) == pytest.approx(20.0, rel=0.1)
    assert w.rate(100.0) == 0.0


def test_rate_without_a_start_counts_from_the_first_record_at_least_one_second() -> None:
    w = LatencyWindow()
    w.record(50.0, 0.001)
    assert w.rate(50.1) == 1.0
    w.record(51.0, 0.001)
    w.record(51.5, 0.001)
    assert w.rate(52.0) == pytest.approx(3 / 2.0)


def test_memory_stays_bounded() -> None:
    w = LatencyWindow(seconds=5)
    for i in range(20_000):
        w.record(i * 0.01, (i % 977 + 1) * 1e-5)
    assert len(w._secs) == 5
    assert all(len(b) <= 200 for b in w._bins)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        LatencyWindow(seconds=0)
    with pytest.raises(ValueError):
        LatencyWindow(resolution=1.0)
