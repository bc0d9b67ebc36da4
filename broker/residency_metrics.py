"""Prometheus series of on-demand model control: loads, evictions, cold starts and resident bytes.

The broker loop is the only writer; it replaces each table whole (copy on write), so the scrape thread
always reads a consistent snapshot without locks. Loads and evictions are rare, so the copies cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

__all__ = ["COLD_START_BUCKETS_S", "ResidencyMetrics"]

COLD_START_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class _ColdStarts:
    counts: tuple[int, ...] = (0,) * (len(COLD_START_BUCKETS_S) + 1)  # the last one: above every bucket
    total_s: float = 0.0

    def add(self, seconds: float) -> _ColdStarts:
        i = next((k for k, b in enumerate(COLD_START_BUCKETS_S) if seconds <= b), len(COLD_START_BUCKETS_S))
        counts = list(self.counts)
        counts[i] += 1
        return _ColdStarts(tuple(counts), self.total_s + seconds)


@dataclass(eq=False)  # a collector the registry keeps in a dict: hashed by identity
class ResidencyMetrics:
    budget: Mapping[str, int] = field(default_factory=dict)
    loads: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, result) -> count
    evictions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, reason) -> count
    resident: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, memory) -> bytes
    cold: _ColdStarts = field(default_factory=_ColdStarts)

    def loaded(self, model: str, ok: bool, seconds: float | None = None) -> None:
        key = (model, "ok" if ok else "failed")
        self.loads = {**self.loads, key: self.loads.get(key, 0) + 1}
        if ok and seconds is not None:
            self.cold = self.cold.add(seconds)

    def evicted(self, model: str, reason: str) -> None:
        key = (model, reason)
        self.evictions = {**self.evictions, key: self.evictions.get(key, 0) + 1}

    def measured(self, footprints: Mapping[str, Mapping[str, int]]) -> None:
        self.resident = {(model, m): n for model, fp in footprints.items() for m, n in fp.items()}

    def collect(self) -> Iterator[Metric]:
        loads = CounterMetricFamily("zinfer_model_loads", "Model loads on demand, by result",
                                    labels=["model", "result"])  # fmt: skip
        for (model, result), n in sorted(self.loads.items()):
            loads.add_metric([model, result], float(n))
        evictions = CounterMetricFamily(
            "zinfer_model_evictions", "Models unloaded to stay within a memory budget (reason budget) or "
            "after their idle time (reason idle)", labels=["model", "reason"],
        )  # fmt: skip
        for (model, reason), n in sorted(self.evictions.items()):
            evictions.add_metric([model, reason], float(n))
        cold = self.cold
        hist = HistogramMetricFamily(
            "zinfer_model_cold_start_seconds", "Seconds from a model's first request to its instances ready"
        )
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*COLD_START_BUCKETS_S, float("inf")), cold.counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        hist.add_metric([], buckets, cold.total_s)
        resident = GaugeMetricFamily("zinfer_model_resident_bytes", "Measured memory of a loaded model's "
                                     "instances (host: worker RSS; gpuN: device memory)",
                                     labels=["model", "memory"])  # fmt: skip
        totals: dict[str, int] = {}
        for (model, memory), n in sorted(self.resident.items()):
            resident.add_metric([model, memory], float(n))
            totals[memory] = totals.get(memory, 0) + n
        used = GaugeMetricFamily("zinfer_memory_resident_bytes", "Measured memory of every loaded model",
                                 labels=["memory"])  # fmt: skip
        for memory, n in sorted(totals.items()):
            used.add_metric([memory], float(n))
        budget = GaugeMetricFamily("zinfer_memory_budget_bytes", "The memory budget (--memory-budget)",
                                   labels=["memory"])  # fmt: skip
        for memory, n in sorted(self.budget.items()):
            budget.add_metric([memory], float(n))
        yield from (loads, evictions, hist, resident, used, budget)
