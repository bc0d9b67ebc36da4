"""The custom metrics of model code (``pb_utils.MetricFamily``), merged from the workers' heartbeats.

Each worker's heartbeat carries a checked snapshot of its families (``zinfer.client.metric_snapshot``); the
broker loop stores the latest one per worker (``update``) and publishes the whole set as one tuple, which the
scrape thread turns into metric families (``collect``) beside the built-in ones. Every metric gets the
labels ``model`` and ``version`` of its worker, unless the model set a label of that name itself.

The instances of one model share their metrics, as Triton's core shares one metric between the stub
processes that create it: counters and histograms with the same name and labels are summed over the
instances; a gauge shows the value of the instance that reported it last. A worker that stops sending
heartbeats is forgotten after ``STALE_S`` seconds (its counters go with it, as when Triton unloads a model).
A family whose kind or description differs from the one another worker gave first is left out, logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

from zinfer.client.metric_snapshot import FamilySnapshot, MetricSnapshot

__all__ = ["STALE_S", "CustomMetrics"]

log = logging.getLogger(__name__)

STALE_S = 30.0


@dataclass(frozen=True, slots=True)
class _Report:
    model: str
    version: int
    at: float
    families: tuple[FamilySnapshot, ...]


def _labels(report: _Report, m: MetricSnapshot) -> tuple[tuple[str, str], ...]:
    labels = dict(m.labels)
    labels.setdefault("model", report.model)
    labels.setdefault("version", str(report.version))
    return tuple(sorted(labels.items()))


class CustomMetrics:
    """The store the broker loop writes (``update``) and the scrape thread reads (``collect``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_worker: dict[bytes, _Report] = {}
        self._published: tuple[_Report, ...] = ()
        self._conflicts_logged: set[str] = set()

    def update(self, worker: bytes, model: str, version: int, families: tuple[FamilySnapshot, ...]) -> None:
        now = self._clock()
        if families:
            self._by_worker[worker] = _Report(model, version, now, families)
        else:
            self._by_worker.pop(worker, None)
        for key in [k for k, r in self._by_worker.items() if now - r.at > STALE_S]:
            del self._by_worker[key]
        self._published = tuple(sorted(self._by_worker.values(), key=lambda r: r.at))

    def collect(self) -> Iterator[Metric]:
        now = self._clock()  # oldest first, so the last gauge reading wins; stale workers are left out
        reports = [r for r in self._published if now - r.at <= STALE_S]
        heads: dict[str, tuple[str, str]] = {}
        scalars: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        hists: dict[str, dict[tuple[tuple[str, str], ...], tuple[tuple[float, ...], list[int], float]]] = {}
        for report in reports:
            for family in report.families:
                head = heads.setdefault(family.name, (family.kind, family.help))
                if head != (family.kind, family.help):
                    if family.name not in self._conflicts_logged:
                        log.warning(
                            "event=custom_metric_conflict family=%s model=%s", family.name, report.model
                        )
                        self._conflicts_logged.add(family.name)
                    continue
                for m in family.metrics:
                    key = _labels(report, m)
                    if family.kind == "histogram":
                        series = hists.setdefault(family.name, {})
                        found = series.get(key)
                        if found is None or found[0] != m.buckets:
                            series[key] = (m.buckets, list(m.counts), m.sum)
                        else:
                            found[1][:] = [a + b for a, b in zip(found[1], m.counts, strict=True)]
                            series[key] = (m.buckets, found[1], found[2] + m.sum)
                    elif family.kind == "counter":
                        values = scalars.setdefault(family.name, {})
                        values[key] = values.get(key, 0.0) + m.value
                    else:
                        scalars.setdefault(family.name, {})[key] = m.value
        for name, (kind, doc) in heads.items():
            if kind == "histogram":
                yield from _histogram(name, doc, hists.get(name, {}))
                continue
            # a counter keeps the name the model gave it, as Triton exports it (render fixes its header)
            fam: Metric = Metric(name, doc, "counter") if kind == "counter" else GaugeMetricFamily(name, doc)
            for key, value in scalars.get(name, {}).items():
                fam.add_sample(name, dict(key), value)
            yield fam

    def counter_names(self) -> list[str]:
        """The counters' names, which ``ServerMetrics.render`` writes without prometheus_client's _total."""
        return sorted(
            {
                f.name.removesuffix("_total")
                for r in self._published
                for f in r.families
                if f.kind == "counter"
            }
        )


def _histogram(
    name: str, doc: str, series: dict[tuple[tuple[str, str], ...], tuple[tuple[float, ...], list[int], float]]
) -> Iterator[Metric]:
    fam = HistogramMetricFamily(name, doc)
    for key, (bounds, counts, total) in series.items():
        labels = dict(key)
        cumulative = 0
        for bound, count in zip((*map(repr, bounds), "+Inf"), counts, strict=True):
            cumulative += count
            fam.add_sample(name + "_bucket", {**labels, "le": bound}, float(cumulative))
        fam.add_sample(name + "_count", labels, float(cumulative))
        fam.add_sample(name + "_sum", labels, total)
    yield fam
