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

import ctypes
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
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
LATENCY_BUCKETS_US: tuple[float, ...] = (
    50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7,
)  # fmt: skip
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # Triton's nv_inference_request_failure
BATCH_REASONS = ("preferred", "max_size", "shape_cut", "delay_expired", "idle_no_delay", "no_batching")
_MV = ("model", "version")
_WORKER_LABELS = ("model", "version", "model_instance", "device")  # "instance" is Prometheus's


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Batch-size bucket bounds: every size up to 32, then powers of two, then ``max_batch_size``."""
    top = max(1, max_batch_size)
    bounds = list(range(1, min(top, 32) + 1))
    size = 64
    while size < top:
        bounds.append(size)
        size *= 2
    if bounds[-1] != top:
        bounds.append(top)
    return tuple(bounds)


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


class ModelMetrics:
    """The figures of one model version. Every method is a handful of additions: call it inline.

    Count each failed request once, with exactly one of ``failure`` / ``rejected`` / ``timed_out`` /
    ``cancelled`` (the last three also count Triton's REJECTED / REJECTED / CANCELED reasons).
    """

    __slots__ = (
        "name", "version", "batch_bounds", "_owner", "_success", "_inferences", "_execs",
        "_request_us", "_queue_us", "_input_us", "_infer_us", "_output_us", "_request_hist",
        "_queue_hist", "_delay_hist", "_delay_us", "_batch_hist", "_batch_rows", "_failures",
        "_reasons", "_pending", "_input_bytes", "_output_bytes", "_rejected", "_timed_out", "_cancelled",
        "cache_enabled", "_cache_hits", "_cache_misses", "_cache_hit_us", "_cache_miss_us",
    )  # fmt: skip

    def __init__(self, name: str, version: int, max_batch_size: int, owner: ServerMetrics) -> None:
        self.name = name
        self.version = version
        self.batch_bounds = batch_buckets(max_batch_size)
        self._owner = owner
        self._success = self._inferences = self._execs = self._pending = 0
        self._input_bytes = self._output_bytes = self._rejected = self._timed_out = self._cancelled = 0
        self._request_us = self._queue_us = self._input_us = self._infer_us = self._output_us = 0.0
        self._delay_us = 0.0
        self._batch_rows = 0
        n = len(LATENCY_BUCKETS_US) + 1
        self._request_hist = [0] * n
        self._queue_hist = [0] * n
        self._delay_hist = [0] * n
        self._batch_hist = [0] * (len(self.batch_bounds) + 1)
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        self._reasons = dict.fromkeys(BATCH_REASONS, 0)
        self.cache_enabled = False  # export the nv_cache_* series (the model uses the response cache)
        self._cache_hits = self._cache_misses = 0
        self._cache_hit_us = self._cache_miss_us = 0.0

    def success(
        self,
        request_us: float,
        queue_us: float,
        rows: int,
        input_us: float = 0.0,
        infer_us: float = 0.0,
        output_us: float = 0.0,
    ) -> None:
        """A request answered OK: its end-to-end and queue time, its batch rows, and the compute times of
        the batch it ran in (Triton adds those per request, so ``compute_*_duration / success`` is the
        mean compute time a request saw)."""
        self._success += 1
        self._inferences += rows
        self._request_us += request_us
        self._queue_us += queue_us
        self._input_us += input_us
        self._infer_us += infer_us
        self._output_us += output_us
        self._request_hist[bisect_left(LATENCY_BUCKETS_US, request_us)] += 1
        self._queue_hist[bisect_left(LATENCY_BUCKETS_US, queue_us)] += 1

    def batch(self, size: int, reason: str, delay_us: float) -> None:
        """A batch sent to an instance: its rows, why it was cut (``BatchReason.value``), and how long its
        oldest request had waited (what ``max_queue_delay_microseconds`` bounds)."""
        self._execs += 1
        self._batch_rows += size
        self._batch_hist[bisect_left(self.batch_bounds, size)] += 1
        self._delay_us += delay_us
        self._delay_hist[bisect_left(LATENCY_BUCKETS_US, delay_us)] += 1
        try:
            self._reasons[reason] += 1
        except KeyError:
            self._reasons = {**self._reasons, reason: 1}  # a new reason: publish a new dict

    def failure(self, reason: str = "OTHER") -> None:
        """A request that failed: ``BACKEND`` (the model raised), ``OTHER``, ``REJECTED``, ``CANCELED``."""
        try:
            self._failures[reason] += 1
        except KeyError:
            self._failures["OTHER"] += 1

    def rejected(self) -> None:
        """Refused on arrival (queue full, model not ready); counted as Triton's REJECTED too."""
        self._rejected += 1
        self._failures["REJECTED"] += 1

    def timed_out(self) -> None:
        """Dropped from the queue when its timeout passed; counted as Triton's REJECTED too."""
        self._timed_out += 1
        self._failures["REJECTED"] += 1

    def cancelled(self) -> None:
        """Cancelled by its client before it ran; counted as Triton's CANCELED too."""
        self._cancelled += 1
        self._failures["CANCELED"] += 1

    def pending(self, n: int) -> None:
        """Requests queued and not yet sent to an instance (set after every add and dispatch)."""
        self._pending = n

    def bytes(self, inp: int, out: int) -> None:
        """Tensor bytes of one request (through shared memory or inline)."""
        self._input_bytes += inp
        self._output_bytes += out

    def cache_hit(self, lookup_us: float) -> None:
        """A request answered from the response cache; ``lookup_us`` is the lookup time."""
        self._cache_hits += 1
        self._cache_hit_us += lookup_us

    def cache_miss(self, lookup_us: float) -> None:
        """A cache lookup that found nothing; its insert time is added by ``cache_insert`` if it is stored."""
        self._cache_misses += 1
        self._cache_miss_us += lookup_us

    def cache_insert(self, insert_us: float) -> None:
        """A missed request's result copied into the cache (Triton counts it in the miss duration)."""
        self._cache_miss_us += insert_us

    def remove(self) -> None:
        """Stop exporting this model version (on unload). Calls after this are harmless."""
        self._owner._drop(self)


# (metric name, attribute, help) of the per-model counters. The nv_ ones are Triton's, without _total.
_COUNTERS = (
    ("nv_inference_request_success", "_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_count", "_inferences", "Number of inferences performed (a request of n rows counts n)"),
    ("nv_inference_exec_count", "_execs", "Number of model executions performed (batches)"),
    ("nv_inference_request_duration_us", "_request_us", "Cumulative inference request duration in us"),
    ("nv_inference_queue_duration_us", "_queue_us", "Cumulative inference queuing duration in us"),
    ("nv_inference_compute_input_duration_us", "_input_us", "Cumulative compute input duration in us"),
    ("nv_inference_compute_infer_duration_us", "_infer_us", "Cumulative compute inference duration in us"),
    ("nv_inference_compute_output_duration_us", "_output_us", "Cumulative compute output duration in us"),
    ("zinfer_input_bytes_total", "_input_bytes", "Input tensor bytes received"),
    ("zinfer_output_bytes_total", "_output_bytes", "Output tensor bytes returned"),
    ("zinfer_requests_rejected_total", "_rejected", "Requests refused on arrival"),
    ("zinfer_requests_timed_out_total", "_timed_out", "Requests dropped from the queue by their timeout"),
    ("zinfer_requests_cancelled_total", "_cancelled", "Requests cancelled by their client before running"),
)
_REASON_COUNTERS = (  # label "reason"
    ("nv_inference_request_failure", "_failures", "Number of failed inference requests, all batch sizes"),
    ("zinfer_batch_reason_total", "_reasons", "Batches sent, by the reason the batch was cut"),
)
_CACHE_COUNTERS = (  # only for model versions with the response cache on
    ("nv_cache_num_hits_per_model", "_cache_hits", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "_cache_misses", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "_cache_hit_us", "Total cache hit (lookup) duration in us"),
    ("nv_cache_miss_duration_per_model", "_cache_miss_us", "Total cache miss (lookup+insert) duration in us"),
)
_HISTOGRAMS = (  # (name, bucket counts, sum, help); the batch-size buckets are per model
    ("nv_inference_request_duration_histogram_us", "_request_hist", "_request_us", "Request duration in us"),
    ("nv_inference_queue_duration_histogram_us", "_queue_hist", "_queue_us", "Request queue time in us"),
    ("zinfer_queue_delay_us", "_delay_hist", "_delay_us", "Wait of a batch's oldest request in us"),
    ("zinfer_batch_size", "_batch_hist", "_batch_rows", "Rows per batch sent to an instance"),
)
_BARE_COUNTERS = [
    n for n, _, _ in (*_COUNTERS, *_REASON_COUNTERS, *_CACHE_COUNTERS) if not n.endswith("_total")
]


def _counter(name: str, doc: str) -> Metric:
    # Samples carry the full name; a bare (Triton) name has its header fixed in ServerMetrics.render.
    return Metric(name.removesuffix("_total"), doc, "counter")


def _histogram(
    family: HistogramMetricFamily, labels: list[str], bounds: Sequence[float], counts: list[int], total: float
) -> None:
    cumulative, buckets = 0, []
    for bound, count in zip((*map(repr, map(float, bounds)), "+Inf"), counts, strict=True):
        cumulative += count
        buckets.append((bound, float(cumulative)))
    family.add_metric(labels, buckets, total)


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
        self._nvml = _Nvml.load() if gpu else None
        self._gpu_collector = _Collector(self._nvml.collect if self._nvml else tuple)
        self.registry.register(_Collector(self._collect_models))
        self.registry.register(_Collector(self._collect_workers))
        self.registry.register(_Collector(self._collect_frontdoors))
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

    def _drop(self, m: ModelMetrics) -> None:
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
        for name in _BARE_COUNTERS:  # prometheus_client names every counter family <name>_total
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
        models = self._models
        labels = {m: {"model": m.name, "version": str(m.version)} for m in models}
        for name, attr, doc in _COUNTERS:
            fam = _counter(name, doc)
            for m in models:
                fam.add_sample(name, labels[m], float(getattr(m, attr)))
            yield fam
        for name, attr, doc in _REASON_COUNTERS:
            fam = _counter(name, doc)
            for m in models:
                for reason, n in dict(getattr(m, attr)).items():
                    fam.add_sample(name, {**labels[m], "reason": reason}, float(n))
            yield fam
        cached = [m for m in models if m.cache_enabled]
        for name, attr, doc in _CACHE_COUNTERS if cached else ():
            fam = _counter(name, doc)
            for m in cached:
                fam.add_sample(name, labels[m], float(getattr(m, attr)))
            yield fam
        for name, attr, total, doc in _HISTOGRAMS:
            h = HistogramMetricFamily(name, doc, labels=_MV)
            for m in models:
                bounds = m.batch_bounds if attr == "_batch_hist" else LATENCY_BUCKETS_US
                _histogram(h, list(labels[m].values()), bounds, list(getattr(m, attr)), getattr(m, total))
            yield h
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Requests not yet sent", labels=_MV)
        for m in models:
            pending.add_metric(list(labels[m].values()), m._pending)
        yield pending
        yield GaugeMetricFamily("zinfer_shm_mapped_bytes", "Bytes of client shm regions", self._shm_bytes)
        yield from _cache_families(self._cache)

    def _collect_workers(self) -> Iterator[Metric]:
        try:
            records = list(self._workers())
        except Exception:  # a scrape must never fail on the workers callback
            log.warning("event=metrics_workers_failed", exc_info=True)
            records = []
        rss = GaugeMetricFamily("zinfer_worker_rss_bytes", "Worker resident memory", labels=_WORKER_LABELS)
        cpu = _counter("zinfer_worker_cpu_seconds_total", "Worker CPU time, user and system")
        restarts = _counter("zinfer_worker_restarts_total", "Restarts of this worker slot")
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
        restarts = _counter("zinfer_frontdoor_restarts_total", "Restarts of this front-door process")
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
    evictions = _counter("zinfer_cache_evictions_total", "Responses evicted from the cache to make room")
    evictions.add_sample("zinfer_cache_evictions_total", {}, float(cache.evictions))
    yield evictions


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Nvml:
    """GPU figures through libnvidia-ml, loaded with ctypes (no NVIDIA Python package needed)."""

    def __init__(self, lib: ctypes.CDLL, devices: list[tuple[str, ctypes.c_void_p]]) -> None:
        self._lib = lib
        self._devices = devices

    @classmethod
    def load(cls, names: Sequence[str] = ("libnvidia-ml.so.1", "libnvidia-ml.so")) -> _Nvml | None:
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                if lib.nvmlInit_v2() != 0:
                    return None
                count = ctypes.c_uint(0)
                if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                    lib.nvmlShutdown()
                    return None
                devices = []
                for i in range(count.value):
                    handle, uuid = ctypes.c_void_p(), ctypes.create_string_buffer(96)
                    if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                        continue
                    ok = lib.nvmlDeviceGetUUID(handle, uuid, 96) == 0
                    devices.append((uuid.value.decode() if ok else f"gpu{i}", handle))
                log.debug("event=nvml_loaded devices=%d", len(devices))
                return cls(lib, devices)
            except (OSError, AttributeError):
                continue
        return None

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily(
            "nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0]", labels=["gpu_uuid"]
        )
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory", labels=["gpu_uuid"])
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory", labels=["gpu_uuid"])
        for uuid, handle in self._devices:
            rates, mem = _Utilization(), _Memory()
            if self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0:
                util.add_metric([uuid], rates.gpu / 100.0)  # not supported under MIG: left out
            if self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0:
                used.add_metric([uuid], float(mem.used))
                total.add_metric([uuid], float(mem.total))
        yield from (util, used, total)

    def shutdown(self) -> None:
        self._lib.nvmlShutdown()
