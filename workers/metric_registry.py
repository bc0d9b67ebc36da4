"""The custom metrics one worker process holds (its ``WorkerRuntime.metrics``): what ``pb_utils.MetricFamily``
and ``Metric`` (``zinfer.workers.custom_metrics``) write and what each heartbeat sends
(:meth:`MetricRegistry.snapshot`). Model threads write, the heartbeat thread reads: every access holds the
registry's lock."""

from __future__ import annotations

import threading

from zinfer.client.metric_snapshot import FamilySnapshot, MetricSnapshot

__all__ = ["KIND_NAMES", "MetricRegistry"]

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


class Family:
    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.metrics: dict[tuple[tuple[str, str], ...], State] = {}


class State:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.value = 0.0
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1) if buckets else []
        self.sum = 0.0


class MetricRegistry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, Family] = {}
        self.metric_count = 0

    def snapshot(self) -> tuple[FamilySnapshot, ...]:
        """Every family of this process as it is now (the heartbeat sends it)."""
        with self.lock:
            return tuple(
                FamilySnapshot(
                    f.name,
                    f.description,
                    KIND_NAMES[f.kind],
                    tuple(
                        MetricSnapshot(k, s.value, s.buckets, tuple(s.counts), s.sum)
                        for k, s in f.metrics.items()
                    ),
                )
                for f in self.families.values()
            )
