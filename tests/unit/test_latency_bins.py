"""The statistics' cumulative latency histogram: log-spaced bins, a quantile exact to one bin."""

from __future__ import annotations

import numpy as np

from zinfer.broker.model_state import LATENCY_RESOLUTION, LatencyBins, ModelStats


def test_each_latency_lands_in_the_bin_whose_upper_edge_bounds_it() -> None:
    bins = LatencyBins()
    samples_ns = [500, 1000, 1_050_000, 33_000_000, 33_000_000]
    for ns in samples_ns:
        bins.add(ns)
    listed = bins.to_list()
    assert sum(n for _, n in listed) == len(samples_ns)
    assert listed[0] == [1.0, 2]  # under 1 us counts as 1 us
    for (upper, _), ns in zip(listed[1:], (1_050_000, 33_000_000), strict=True):
        assert upper / LATENCY_RESOLUTION < ns / 1000 <= upper


def test_a_quantile_from_the_bins_is_within_five_percent() -> None:
    rng = np.random.default_rng(1)
    lat_us = rng.lognormal(mean=8, sigma=0.7, size=20_000)
    bins = LatencyBins()
    for us in lat_us:
        bins.add(int(us * 1000))
    total, seen, p99 = len(lat_us), 0, 0.0
    for upper, n in bins.to_list():
        seen += n
        if seen >= 0.99 * total:
            p99 = upper
            break
    exact = float(np.percentile(lat_us, 99))
    assert exact <= p99 * 1.0001 and p99 <= exact * LATENCY_RESOLUTION * 1.0001


def test_statistics_carry_the_histogram_of_successes() -> None:
    stats = ModelStats()
    stats.record_success(2_000_000)
    stats.record_success(3_000_000)
    d = stats.to_dict()
    assert d["inference_stats"]["success"] == {"count": 2, "ns": 5_000_000}
    assert sum(n for _, n in d["latency_us"]) == 2
