"""The figures of one model version, with Triton's names, and the families they become at a scrape.

The broker loop is the only writer: ``ModelMetrics`` methods only add to plain slotted attributes of an
object bound once per model version (no locks, no label lookups). ``collect_models`` turns a tuple of them
into metric families on the scrape thread. Triton's counters keep Triton's names (no ``_total``; see
``BARE_COUNTERS``); the request and queue histograms take the names of Triton's core PR #474.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

__all__ = [
    "BARE_COUNTERS",
    "BATCH_REASONS",
    "FAILURE_REASONS",
    "LATENCY_BUCKETS_US",
    "ModelMetrics",
    "batch_buckets",
    "collect_models",
    "counter",
]

LATENCY_BUCKETS_US: tuple[float, ...] = (
    50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7,
)  # fmt: skip
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # Triton's nv_inference_request_failure
BATCH_REASONS = (
    "preferred", "max_size", "shape_cut", "delay_expired", "idle_no_delay", "early_no_companion",
    "no_batching",
)  # fmt: skip
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


class _Owner(Protocol):
    def drop(self, m: ModelMetrics) -> None: ...


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

    def __init__(self, name: str, version: int, max_batch_size: int, owner: _Owner) -> None:
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
        """Requests queued and not yet sent to an instance: set whenever a request joins the queue, leaves it
        in a batch, or leaves it unanswered by an instance (cancelled, timed out, failed), before that
        request's answer is sent; the observer's periodic snapshot sets it too."""
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
        self._owner.drop(self)


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
BARE_COUNTERS = [
    n for n, _, _ in (*_COUNTERS, *_REASON_COUNTERS, *_CACHE_COUNTERS) if not n.endswith("_total")
]


def counter(name: str, doc: str) -> Metric:
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


def collect_models(models: Sequence[ModelMetrics]) -> Iterator[Metric]:
    """The per-model families of one scrape, over a tuple of models the broker swaps whole."""
    labels = {m: {"model": m.name, "version": str(m.version)} for m in models}
    for name, attr, doc in _COUNTERS:
        fam = counter(name, doc)
        for m in models:
            fam.add_sample(name, labels[m], float(getattr(m, attr)))
        yield fam
    for name, attr, doc in _REASON_COUNTERS:
        fam = counter(name, doc)
        for m in models:
            for reason, n in dict(getattr(m, attr)).items():
                fam.add_sample(name, {**labels[m], "reason": reason}, float(n))
        yield fam
    cached = [m for m in models if m.cache_enabled]
    for name, attr, doc in _CACHE_COUNTERS if cached else ():
        fam = counter(name, doc)
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
