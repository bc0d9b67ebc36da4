"""``pb_utils.MetricFamily`` and ``Metric``: the custom metrics of a Triton python model, as Triton documents.

::

    family = pb_utils.MetricFamily(name="done", description="...", kind=pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"route": "a"})          # HISTOGRAM: family.Metric(labels, buckets=[...])
    metric.increment(1)   # COUNTER (>= 0) and GAUGE
    metric.set(2.5)       # GAUGE only
    metric.observe(0.3)   # HISTOGRAM only
    metric.value()        # COUNTER and GAUGE

A family created twice with the same name, description and kind is the same family; a metric created twice
with the same labels is the same metric (as Triton's core shares them). Misuse raises
``pb_utils.TritonModelException`` naming what is wrong.

How they reach ``/metrics``: every heartbeat of the worker (``zinfer.workers.heartbeat``, every
``heartbeat_interval_s``) carries a snapshot of this process's families (``MetricRegistry.snapshot``, the
worker runtime's registry), and the broker merges the snapshots of all workers into its Prometheus registry,
labelled with ``model`` and ``version`` unless the model set those labels itself
(``zinfer.broker.custom_metrics``). Figures therefore reach a scrape within one heartbeat interval. The
heartbeat, not prometheus_client's multiprocess mode, because the broker already hears from every worker on
it, a worker that dies takes nothing with it (no files left in a shared folder), and what a worker sends is
checked and bounded like every other message (``zinfer.client.metric_snapshot``).
"""

from __future__ import annotations

import bisect
import math
from typing import Any, NoReturn

from zinfer.client.metric_snapshot import (
    MAX_BUCKETS,
    MAX_FAMILIES,
    MAX_LABELS,
    MAX_METRICS,
    MAX_TEXT,
    check_label_name,
    check_metric_name,
)

from .metric_registry import KIND_NAMES, Family, State
from .pb_errors import TritonModelException
from .runtime import current

__all__ = ["Metric", "MetricFamily"]

def _fail(message: str) -> NoReturn:
    raise TritonModelException(message)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        _fail(f"{what} must be a number, got {value!r}")
    return float(value)


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KIND_NAMES = KIND_NAMES

    def __init__(self, name: str, description: str, kind: int) -> None:
        problem = check_metric_name(name)
        if problem:
            _fail(f"MetricFamily {name!r}: {problem}")
        if not isinstance(description, str) or len(description) > MAX_TEXT:
            _fail(f"MetricFamily {name!r}: description must be a string of at most {MAX_TEXT} characters")
        if kind not in self._KIND_NAMES:
            _fail(
                f"MetricFamily {name!r}: kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM, got {kind!r}"
            )
        registry = current().metrics
        with registry.lock:
            found = registry.families.get(name)
            if found is None:
                if len(registry.families) >= MAX_FAMILIES:
                    _fail(f"MetricFamily {name!r}: a model may define at most {MAX_FAMILIES} metric families")
                found = registry.families[name] = Family(name, description, kind)
            elif (found.description, found.kind) != (description, kind):
                _fail(f"MetricFamily {name!r} already exists with another description or kind")
        self._family, self._registry = found, registry
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        return Metric(self, labels, buckets)


class Metric:
    def __init__(
        self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> None:
        fam, registry = family._family, family._registry
        key = self._labels(fam.name, labels)
        bounds: tuple[float, ...] = ()
        if fam.kind == MetricFamily.HISTOGRAM:
            if not buckets or len(buckets) > MAX_BUCKETS:
                _fail(f"metric of histogram family {fam.name!r}: give 1 to {MAX_BUCKETS} buckets")
            bounds = tuple(_number(b, "a bucket") for b in buckets)
            if list(bounds) != sorted(set(bounds)):
                _fail(f"metric of histogram family {fam.name!r}: buckets must be ascending and distinct")
        elif buckets is not None:
            _fail(f"metric of family {fam.name!r}: buckets are for HISTOGRAM families only")
        with registry.lock:
            state = fam.metrics.get(key)
            if state is None:
                if registry.metric_count >= MAX_METRICS:
                    _fail(f"metric of family {fam.name!r}: a model may define at most {MAX_METRICS} metrics")
                state = fam.metrics[key] = State(bounds)
                registry.metric_count += 1
            elif state.buckets != bounds:
                _fail(f"metric of histogram family {fam.name!r} with these labels exists with other buckets")
        self._family, self._state, self._lock = fam, state, registry.lock

    @staticmethod
    def _labels(family: str, labels: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
        labels = labels or {}
        if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
            _fail(f"metric of family {family!r}: labels must be a dict of at most {MAX_LABELS} entries")
        for name, value in labels.items():
            problem = check_label_name(name)
            if problem:
                _fail(f"metric of family {family!r}: {problem}")
            if not isinstance(value, str) or len(value) > MAX_TEXT:
                _fail(f"metric of family {family!r}: label {name!r} needs a string value")
        return tuple(sorted(labels.items()))

    def increment(self, value: float) -> None:
        amount = _number(value, "increment")
        kind = self._family.kind
        if kind == MetricFamily.HISTOGRAM:
            _fail(f"{self._family.name!r} is a histogram: use observe()")
        if kind == MetricFamily.COUNTER and amount < 0:
            _fail(f"counter {self._family.name!r} cannot be incremented by a negative value ({amount})")
        with self._lock:
            self._state.value += amount

    def set(self, value: float) -> None:
        amount = _number(value, "value")
        if self._family.kind != MetricFamily.GAUGE:
            _fail(f"{self._family.name!r} is not a gauge: only a GAUGE metric can be set")
        with self._lock:
            self._state.value = amount

    def observe(self, value: float) -> None:
        amount = _number(value, "observation")
        if self._family.kind != MetricFamily.HISTOGRAM:
            _fail(f"{self._family.name!r} is not a histogram: only a HISTOGRAM metric can observe")
        state = self._state
        with self._lock:
            state.counts[bisect.bisect_left(state.buckets, amount)] += 1
            state.sum += amount

    def value(self) -> float:
        if self._family.kind == MetricFamily.HISTOGRAM:
            _fail(f"{self._family.name!r} is a histogram: it has no single value")
        with self._lock:
            return self._state.value
