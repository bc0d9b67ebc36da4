"""Custom metrics on the wire: what a worker's heartbeat carries of the metrics its model code defined.

A model defines metric families with ``pb_utils.MetricFamily`` (``zinfer.workers.custom_metrics``); every
heartbeat of its worker carries a snapshot of all of them under the key ``"metrics"``::

    [ {"name": str, "help": str, "kind": "counter" | "gauge" | "histogram",
       "metrics": [ {"labels": {str: str}, "value": float}                                # counter, gauge
                  | {"labels": {str: str}, "buckets": [float], "counts": [int], "sum": float} ] } ]

``counts`` holds one count per bucket plus the ``+Inf`` one (not cumulative). The broker takes nothing a
worker says on trust (it runs user code): ``families_from_wire`` checks every field, the names against
Prometheus's rules, and the sizes against the bounds below, and raises ``ProtocolError`` otherwise.

Part of the worker protocol (beside ``worker_protocol``), so in ``client/`` with the rest of the wire: the
workers write it and the broker reads it; the SDK's clients do not use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ProtocolError

__all__ = [
    "KINDS",
    "MAX_BUCKETS",
    "MAX_FAMILIES",
    "MAX_LABELS",
    "MAX_METRICS",
    "MAX_TEXT",
    "RESERVED_PREFIXES",
    "FamilySnapshot",
    "MetricSnapshot",
    "check_label_name",
    "check_metric_name",
    "families_from_wire",
    "families_to_wire",
]

KINDS = ("counter", "gauge", "histogram")
MAX_FAMILIES = 64
MAX_METRICS = 1024  # all families of one worker together
MAX_LABELS = 16
MAX_BUCKETS = 64
MAX_TEXT = 256  # a name, a label name or value, a description
RESERVED_PREFIXES = ("nv_", "zinfer_", "process_", "python_")  # the server's own series
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    labels: tuple[tuple[str, str], ...]
    value: float = 0.0
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, ascending
    counts: tuple[int, ...] = ()  # one per bucket, then +Inf
    sum: float = 0.0


@dataclass(frozen=True, slots=True)
class FamilySnapshot:
    name: str
    help: str
    kind: str
    metrics: tuple[MetricSnapshot, ...]


def check_metric_name(name: object) -> str | None:
    """Why ``name`` cannot name a custom metric family, or None."""
    if not isinstance(name, str) or not _METRIC_NAME.match(name) or len(name) > MAX_TEXT:
        return f"a metric family name must match [a-zA-Z_:][a-zA-Z0-9_:]* (at most {MAX_TEXT} characters)"
    if name.startswith(RESERVED_PREFIXES):
        return f"metric family names starting with {', '.join(RESERVED_PREFIXES)} are the server's own"
    return None


def check_label_name(name: object) -> str | None:
    if (
        not isinstance(name, str)
        or not _LABEL_NAME.match(name)
        or len(name) > MAX_TEXT
        or name.startswith("__")
    ):
        return f"a label name must match [a-zA-Z_][a-zA-Z0-9_]* and not start with '__', got {name!r}"
    return None


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ProtocolError(f"custom metrics: {what} must be a string of at most {MAX_TEXT} characters")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        raise ProtocolError(f"custom metrics: {what} must be a number")
    return float(value)


def _labels(raw: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping) or len(raw) > MAX_LABELS:
        raise ProtocolError(f"custom metrics: labels must be a map of at most {MAX_LABELS} entries")
    out = []
    for key, value in raw.items():
        problem = check_label_name(key)
        if problem:
            raise ProtocolError(f"custom metrics: {problem}")
        out.append((str(key), _text(value, "a label value")))
    return tuple(sorted(out))


def _metric(raw: object, kind: str) -> MetricSnapshot:
    if not isinstance(raw, Mapping):
        raise ProtocolError("custom metrics: a metric must be a map")
    labels = _labels(raw.get("labels", {}))
    if kind != "histogram":
        return MetricSnapshot(labels, _number(raw.get("value"), "a value"))
    buckets, counts = raw.get("buckets"), raw.get("counts")
    if not isinstance(buckets, list) or not 0 < len(buckets) <= MAX_BUCKETS:
        raise ProtocolError(f"custom metrics: a histogram needs 1 to {MAX_BUCKETS} buckets")
    bounds = tuple(_number(b, "a bucket") for b in buckets)
    if list(bounds) != sorted(set(bounds)):
        raise ProtocolError("custom metrics: buckets must be ascending and distinct")
    if not isinstance(counts, list) or len(counts) != len(bounds) + 1:
        raise ProtocolError("custom metrics: a histogram needs one count per bucket and one for +Inf")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ProtocolError("custom metrics: bucket counts must be whole numbers >= 0")
    return MetricSnapshot(labels, buckets=bounds, counts=tuple(counts), sum=_number(raw.get("sum"), "a sum"))


def families_from_wire(raw: Any) -> tuple[FamilySnapshot, ...]:
    """Check and decode a heartbeat's ``metrics``; ``ProtocolError`` on anything out of shape or bounds."""
    if not isinstance(raw, list) or len(raw) > MAX_FAMILIES:
        raise ProtocolError(f"custom metrics must be a list of at most {MAX_FAMILIES} families")
    families: list[FamilySnapshot] = []
    total = 0
    names: set[str] = set()
    for item in raw:
        if not isinstance(item, Mapping):
            raise ProtocolError("custom metrics: a family must be a map")
        name = item.get("name")
        problem = check_metric_name(name)
        if problem or name in names:
            raise ProtocolError(f"custom metrics: {problem or f'family {name!r} given twice'}")
        assert isinstance(name, str)
        names.add(name)
        kind = item.get("kind")
        if kind not in KINDS:
            raise ProtocolError(f"custom metrics: kind must be one of {', '.join(KINDS)}")
        metrics = item.get("metrics")
        if not isinstance(metrics, list):
            raise ProtocolError("custom metrics: a family's metrics must be a list")
        total += len(metrics)
        if total > MAX_METRICS:
            raise ProtocolError(f"custom metrics: at most {MAX_METRICS} metrics in all")
        decoded = tuple(_metric(m, str(kind)) for m in metrics)
        if len({m.labels for m in decoded}) != len(decoded):
            raise ProtocolError(f"custom metrics: family {name!r} names the same labels twice")
        families.append(
            FamilySnapshot(name, _text(item.get("help", ""), "a description"), str(kind), decoded)
        )
    return tuple(families)


def families_to_wire(families: tuple[FamilySnapshot, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in families:
        metrics: list[dict[str, Any]] = []
        for m in f.metrics:
            entry: dict[str, Any] = {"labels": dict(m.labels)}
            if f.kind == "histogram":
                entry.update(buckets=list(m.buckets), counts=list(m.counts), sum=m.sum)
            else:
                entry["value"] = m.value
            metrics.append(entry)
        out.append({"name": f.name, "help": f.help, "kind": f.kind, "metrics": metrics})
    return out
