"""Prometheus metrics with Triton's names, types and labels, plus zinfer's batching and worker figures.

The broker loop is the only writer. Its calls (``ModelMetrics.success`` and friends) only add to plain
slotted attributes of an object bound once per model version: no locks, no label lookups. The HTTP
thread turns those numbers into metric families when it is scraped (custom collectors on a private
``CollectorRegistry``), reading a model tuple that the broker replaces whole when models come and go.

Triton's counters keep Triton's names (``nv_inference_request_success``, no ``_total``) so that its
dashboards and alerts work unchanged; the request and queue histograms take the names of Triton's core
PR #474 (``nv_inference_{request,queue}_duration_histogram_us``). Durations are in microseconds.

The response cache's series (``nv_cache_*_per_model``) exist only for model versions that use the cache
(``response_cache { enable: true }`` on a server with a cache), as in Triton; the cache's own size and
evictions are zinfer gauges (``zinfer_cache_*``), present only when the server has a cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .custom_metrics import CustomMetrics
from .host_metrics import ENERGY, CpuMetrics, Nvml, pinned_pool_families
from .model_metrics import (
    BARE_COUNTERS,
    BATCH_REASONS,
    FAILURE_REASONS,
    LATENCY_BUCKETS_US,
    ModelMetrics,
    batch_buckets,
    collect_models,
    counter,
)

__all__ = [
    "BATCH_REASONS",
    "CacheFigures",
    "CONTENT_TYPE",
    "FAILURE_REASONS",
    "LATENCY_BUCKETS_US",
    "ModelMetrics",
    "ServerMetrics",
    "WorkerRecord",
    "batch_buckets",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
_WORKER_LABELS = ("model", "version", "model_instance", "device")  # "instance" is Prometheus's


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """The response cache as the broker last saw it (a snapshot it publishes whole)."""

    used_bytes: int
    capacity_bytes: int
    entries: int
    evictions: int


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker process as the broker last saw it. ``state`` ``READY`` counts as up."""

    model: str
    version: int
    instance: int
    pid: int | None
    device: str
    state: str
    restarts: int
    busy_since_ns: int | None = None  # monotonic ns when its current batch was sent; None when idle


class _Collector:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class ServerMetrics:
    """The server's metrics on a private registry. ``workers`` is called on the scrape thread, so it must
    return a snapshot the broker swaps whole (e.g. ``lambda: broker.worker_records``), never walk live
    broker state. ``gpu=False`` skips NVML; without libnvidia-ml there are simply no GPU metrics."""

    def __init__(
        self,
        workers: Callable[[], Sequence[WorkerRecord]] | None = None,
        *,
        frontdoors: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
        gpu: bool = True,
        process: bool = True,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.registry = CollectorRegistry()
        self._clock_ns = clock_ns  # for how long a worker has been busy, at scrape time
        self._workers = workers or (lambda: ())
        self._frontdoors = frontdoors or (lambda: ())
        self._index: dict[tuple[str, int], ModelMetrics] = {}
        self._models: tuple[ModelMetrics, ...] = ()
        self._shm_bytes = 0
        self._cache: CacheFigures | None = None
        self._nvml = Nvml.load() if gpu else None
        self._gpu_collector = _Collector(self._nvml.collect if self._nvml else tuple)
        self.registry.register(_Collector(self._collect_models))
        self.registry.register(_Collector(self._collect_workers))
        self.registry.register(_Collector(self._collect_frontdoors))
        self.registry.register(_Collector(CpuMetrics().collect))
        self.registry.register(_Collector(pinned_pool_families))
        self.custom = CustomMetrics()  # the model code's pb_utils.MetricFamily series, from heartbeats
        self.registry.register(_Collector(self.custom.collect))
        if self._nvml is not None:
            self.registry.register(self._gpu_collector)
        if process:  # the broker's own process_* figures
            ProcessCollector(registry=self.registry)

    def model(self, name: str, version: int, max_batch_size: int = 0) -> ModelMetrics:
        """The metrics of one model version, created on first use; keep it and call it directly."""
        found = self._index.get((name, version))
        if found is None:
            found = self._index[(name, version)] = ModelMetrics(name, version, max_batch_size, self)
            self._models = tuple(self._index.values())
        return found

    def drop(self, m: ModelMetrics) -> None:
        """Stop exporting ``m`` (``ModelMetrics.remove`` calls this)."""
        if self._index.get((m.name, m.version)) is m:
            del self._index[(m.name, m.version)]
            self._models = tuple(self._index.values())

    def shm_bytes(self, n: int) -> None:
        """Bytes of the shared-memory regions registered by clients now."""
        self._shm_bytes = n

    def cache(self, figures: CacheFigures | None) -> None:
        """The response cache's size and evictions now (None: the server has no cache)."""
        self._cache = figures

    @property
    def gpu_enabled(self) -> bool:
        return self._nvml is not None

    def render(self) -> bytes:
        """The exposition text (Prometheus text format, ``CONTENT_TYPE``)."""
        text = generate_latest(self.registry)
        for name in (
            *BARE_COUNTERS,
            ENERGY,
            *self.custom.counter_names(),
        ):  # prometheus_client names every counter family <name>_total
            for kind in (b"HELP", b"TYPE"):
                head = b"# %s %s" % (kind, name.encode())
                text = text.replace(head + b"_total ", head + b" ", 1)
        return text

    def close(self) -> None:
        """Release NVML (GPU metrics stop); the rest keeps working."""
        if self._nvml is not None:
            self.registry.unregister(self._gpu_collector)
            self._nvml.shutdown()
            self._nvml = None

    def _collect_models(self) -> Iterator[Metric]:
        yield from collect_models(self._models)
        yield GaugeMetricFamily("zinfer_shm_mapped_bytes", "Bytes of client shm regions", self._shm_bytes)
        yield from _cache_families(self._cache)

    def _collect_workers(self) -> Iterator[Metric]:
        try:
            records = list(self._workers())
        except Exception:  # a scrape must never fail on the workers callback
            log.warning("event=metrics_workers_failed", exc_info=True)
            records = []
        rss = GaugeMetricFamily("zinfer_worker_rss_bytes", "Worker resident memory", labels=_WORKER_LABELS)
        cpu = counter("zinfer_worker_cpu_seconds_total", "Worker CPU time, user and system")
        restarts = counter("zinfer_worker_restarts_total", "Restarts of this worker slot")
        up = GaugeMetricFamily("zinfer_worker_up", "1 if the worker is READY, else 0", labels=_WORKER_LABELS)
        busy = GaugeMetricFamily("zinfer_worker_busy", "1 while it runs a batch", labels=_WORKER_LABELS)
        busy_doc = "Seconds the worker has been in its current batch (0 when idle)"
        busy_s = GaugeMetricFamily("zinfer_worker_busy_seconds", busy_doc, labels=_WORKER_LABELS)
        now_ns = self._clock_ns()
        for r in records:
            values = [r.model, str(r.version), str(r.instance), r.device]
            label_map = dict(zip(_WORKER_LABELS, values, strict=True))
            up.add_metric(values, 1.0 if r.state == "READY" else 0.0)
            since = r.busy_since_ns
            busy.add_metric(values, 0.0 if since is None else 1.0)
            busy_s.add_metric(values, 0.0 if since is None else max(0.0, (now_ns - since) / 1e9))
            restarts.add_sample(restarts.name + "_total", label_map, float(r.restarts))
            if r.pid is None:
                continue
            try:
                proc = psutil.Process(r.pid)
                with proc.oneshot():
                    mem, times = proc.memory_info(), proc.cpu_times()
            except psutil.Error:
                continue  # gone or not ours: no figures this scrape
            rss.add_metric(values, float(mem.rss))
            cpu.add_sample(cpu.name + "_total", label_map, times.user + times.system)
        yield from (rss, cpu, restarts, up, busy, busy_s)

    def _collect_frontdoors(self) -> Iterator[Metric]:
        """The front-door processes (``zinfer serve --grpc/--http``): up, restarts, requests answered."""
        rows = list(self._frontdoors())
        if not rows:
            return
        up = GaugeMetricFamily("zinfer_frontdoor_up", "1 while the front-door process runs", labels=["index"])
        restarts = counter("zinfer_frontdoor_restarts_total", "Restarts of this front-door process")
        requests = CounterMetricFamily(
            "zinfer_frontdoor_requests", "Requests a front-door process answered, by protocol and result",
            labels=["index", "protocol", "result"],
        )  # fmt: skip
        for row in rows:
            index = str(row["index"])
            up.add_metric([index], 1.0 if row["up"] else 0.0)
            restarts.add_sample(restarts.name + "_total", {"index": index}, float(row["restarts"]))
            for protocol, counts in sorted(row.get("requests", {}).items()):
                for result in ("ok", "failed"):
                    requests.add_metric([index, protocol, result], float(counts.get(result, 0)))
        yield from (up, restarts, requests)


def _cache_families(cache: CacheFigures | None) -> Iterator[Metric]:
    if cache is None:
        return
    yield GaugeMetricFamily("zinfer_cache_used_bytes", "Bytes the response cache holds", cache.used_bytes)
    yield GaugeMetricFamily(
        "zinfer_cache_capacity_bytes", "Size of the response cache in bytes", cache.capacity_bytes
    )
    yield GaugeMetricFamily("zinfer_cache_entries", "Responses the response cache holds", cache.entries)
    evictions = counter("zinfer_cache_evictions_total", "Responses evicted from the cache to make room")
    evictions.add_sample("zinfer_cache_evictions_total", {}, float(cache.evictions))
    yield evictions
