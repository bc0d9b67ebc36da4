"""pb_utils.MetricFamily / Metric in a worker, their snapshot on the wire, and the broker's merge."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from zinfer.broker.custom_metrics import STALE_S, CustomMetrics
from zinfer.client.errors import ProtocolError
from zinfer.client.metric_snapshot import MAX_FAMILIES, families_from_wire, families_to_wire
from zinfer.workers import triton_python_backend_utils as pb
from zinfer.workers.runtime import WorkerRuntime, current, install


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    install(WorkerRuntime())  # a worker's own registry, empty
    yield
    install(WorkerRuntime())


def test_counter_gauge_histogram_as_triton_documents() -> None:
    family = pb.MetricFamily("requests_done", "Requests done", pb.MetricFamily.COUNTER)
    counter = family.Metric(labels={"route": "a"})
    counter.increment(2)
    counter.increment(3.5)
    assert counter.value() == 5.5
    assert family.Metric(labels={"route": "a"}).value() == 5.5  # same labels: the same metric
    gauge = pb.MetricFamily("queue_len", "Queue length", pb.MetricFamily.GAUGE).Metric()
    gauge.set(7)
    gauge.increment(-2)
    assert gauge.value() == 5
    hist = pb.MetricFamily("latency_s", "Latency", pb.MetricFamily.HISTOGRAM).Metric(buckets=[0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 3.0):
        hist.observe(v)
    snap = {f.name: f for f in current().metrics.snapshot()}
    assert snap["requests_done"].kind == "counter" and snap["requests_done"].metrics[0].labels == (
        ("route", "a"),
    )
    h = snap["latency_s"].metrics[0]
    assert h.counts == (2, 1, 1) and h.sum == pytest.approx(3.65)


@pytest.mark.parametrize(
    "misuse, message",
    [
        (lambda: pb.MetricFamily("c", "d", pb.MetricFamily.COUNTER).Metric().increment(-1), "negative"),
        (lambda: pb.MetricFamily("c", "d", pb.MetricFamily.COUNTER).Metric().set(1), "only a GAUGE"),
        (lambda: pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric().observe(1), "only a HISTOGRAM"),
        (lambda: pb.MetricFamily("h", "d", pb.MetricFamily.HISTOGRAM).Metric(), "give 1 to"),
        (lambda: pb.MetricFamily("h", "d", pb.MetricFamily.HISTOGRAM).Metric(buckets=[2, 1]), "ascending"),
        (
            lambda: pb.MetricFamily("h", "d", pb.MetricFamily.HISTOGRAM).Metric(buckets=[1]).value(),
            "no single",
        ),
        (
            lambda: pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric(buckets=[1]),
            "HISTOGRAM families only",
        ),
        (lambda: pb.MetricFamily("1bad", "d", pb.MetricFamily.GAUGE), "must match"),
        (lambda: pb.MetricFamily("nv_inference_count", "d", pb.MetricFamily.GAUGE), "server's own"),
        (lambda: pb.MetricFamily("g", "d", 7), "kind must be"),
        (lambda: pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric(labels={"__x": "1"}), "label name"),
        (lambda: pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric(labels={"a": 1}), "string value"),
        (lambda: pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric().set("x"), "must be a number"),
    ],
)
def test_misuse_raises_triton_model_exception(misuse: object, message: str) -> None:
    with pytest.raises(pb.TritonModelException, match=message):
        misuse()  # type: ignore[operator]


def test_a_family_redefined_differently_is_refused() -> None:
    pb.MetricFamily("x", "one", pb.MetricFamily.GAUGE)
    assert pb.MetricFamily("x", "one", pb.MetricFamily.GAUGE).name == "x"  # the same: fine
    with pytest.raises(pb.TritonModelException, match="already exists"):
        pb.MetricFamily("x", "one", pb.MetricFamily.COUNTER)


def test_the_number_of_families_is_bounded() -> None:
    for i in range(MAX_FAMILIES):
        pb.MetricFamily(f"f{i}", "", pb.MetricFamily.GAUGE)
    with pytest.raises(pb.TritonModelException, match="at most"):
        pb.MetricFamily("one_more", "", pb.MetricFamily.GAUGE)


@pytest.mark.parametrize(
    "raw",
    [
        "x",
        [{"name": "nv_inference_count", "kind": "counter", "metrics": []}],
        [{"name": "a b", "kind": "counter", "metrics": []}],
        [{"name": "a", "kind": "summary", "metrics": []}],
        [{"name": "a", "kind": "gauge", "metrics": [{"labels": {"l": "v"}, "value": "1"}]}],
        [{"name": "a", "kind": "gauge", "metrics": [{"labels": {"__name__": "v"}, "value": 1}]}],
        [{"name": "a", "kind": "gauge", "metrics": [{"value": 1}, {"value": 2}]}],
        [{"name": "a", "kind": "histogram", "metrics": [{"buckets": [1], "counts": [1], "sum": 1}]}],
        [{"name": "a", "kind": "histogram", "metrics": [{"buckets": [1], "counts": [-1, 0], "sum": 1}]}],
        [{"name": f"f{i}", "kind": "gauge", "metrics": []} for i in range(MAX_FAMILIES + 1)],
        [{"name": "a", "kind": "gauge", "metrics": [{"labels": {"x": "y" * 300}, "value": 1}]}],
    ],
)
def test_hostile_snapshots_are_rejected(raw: object) -> None:
    with pytest.raises(ProtocolError):
        families_from_wire(raw)


def _scrape(store: CustomMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    registry.register(store)  # type: ignore[arg-type]
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_the_broker_merges_instances_and_labels_model_and_version() -> None:
    now = [100.0]
    store = CustomMetrics(clock=lambda: now[0])
    counter = pb.MetricFamily("done", "Done", pb.MetricFamily.COUNTER).Metric(labels={"route": "a"})
    gauge = pb.MetricFamily("depth", "Depth", pb.MetricFamily.GAUGE).Metric()
    hist = pb.MetricFamily("lat", "Lat", pb.MetricFamily.HISTOGRAM).Metric(buckets=[1.0])
    counter.increment(2)
    gauge.set(4)
    hist.observe(0.5)
    wire = families_from_wire(families_to_wire(current().metrics.snapshot()))
    store.update(b"w0", "m", 1, wire)
    gauge.set(9)
    now[0] += 1
    store.update(b"w1", "m", 1, families_from_wire(families_to_wire(current().metrics.snapshot())))
    v = _scrape(store)
    mv = {("model", "m"), ("version", "1")}
    assert v[("done", frozenset(mv | {("route", "a")}))] == 4  # two instances, summed (Triton: no _total)
    assert v[("depth", frozenset(mv))] == 9  # the last report
    assert v[("lat_bucket", frozenset(mv | {("le", "1.0")}))] == 2
    assert v[("lat_count", frozenset(mv))] == 2
    assert store.counter_names() == ["done"]
    now[0] += STALE_S + 1  # workers that stopped reporting are forgotten
    assert _scrape(store) == {}
