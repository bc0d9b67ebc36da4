"""What the broker shows the outside: Prometheus metrics and health over HTTP, ``zinfer status``, traces.

The HTTP endpoints run on their own thread and never touch broker state: the broker loop publishes an
immutable health snapshot and a tuple of worker records every ``PUBLISH_INTERVAL_S``, and the metric
objects it updates per request are plain counters the scrape thread reads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from zinfer.client.errors import ConfigError

from .cache_path import CachePath
from .http_endpoints import HealthSnapshot, HttpEndpoints
from .instance_pool import InstancePool
from .latency_window import LatencyWindow
from .metrics import ServerMetrics, WorkerRecord
from .model_state import ModelState
from .regions import RegionTable
from .registry import ModelRegistry
from .supervisor import Supervisor
from .trace_settings import TraceSettings
from .tracing import Tracer

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 0.25


class Observer:
    def __init__(
        self,
        registry: ModelRegistry,
        regions: RegionTable,
        caching: CachePath,
        pool: InstancePool,
        supervisor: Supervisor,
        serving_ready: Callable[[], bool],
        trace: TraceSettings | None = None,
    ) -> None:
        self.registry = registry
        self.regions = regions
        self.caching = caching
        self.pool = pool
        self.supervisor = supervisor
        self.serving_ready = serving_ready  # the server's readiness (``Broker.serving_ready``)
        self.worker_records: tuple[WorkerRecord, ...] = ()
        self.health = HealthSnapshot()
        self.metrics = ServerMetrics(lambda: self.worker_records, frontdoors=lambda: self.frontdoor_records)
        self.frontdoor_records: tuple[dict[str, Any], ...] = ()
        self.http: HttpEndpoints | None = None
        self.started = time.monotonic()
        self._next_publish = 0.0
        # the front-door processes (``frontdoor_procs.FrontDoorProcs.snapshot``), when zinfer serve runs any
        self.frontdoors: Callable[[], list[dict[str, Any]]] | None = None
        self.tracer = Tracer(trace or TraceSettings())  # per-request traces and their settings
        self.tracer.read = caching.readers.read  # level TENSORS reads tensors in regions as the cache does

    def start_http(self, address: str) -> None:
        """Serve the metrics and health endpoints on ``address``; a ``ConfigError`` naming the address and
        the flags that change it when it cannot be bound."""
        host, _, port = address.rpartition(":")
        self.http = HttpEndpoints(self.metrics.render, lambda: self.health, host=host, port=int(port))
        try:
            self.http.start()
        except OSError as exc:
            raise ConfigError(
                f"the metrics endpoint cannot listen on {address}: {exc.strerror or exc}; give another "
                "address with --metrics HOST:PORT (port 0: any free port), or --no-metrics to serve no "
                "metrics or health endpoints (key 'metrics' in a --config file)"
            ) from None

    def attach(self, state: ModelState) -> None:
        """Give a new model state its metric series (shared with earlier loads of the same version)."""
        state.metrics = self.metrics.model(state.name, state.version, state.config.max_batch_size)
        state.metrics.cache_enabled = self.caching.enabled_for(state)
        state.window = LatencyWindow()

    def maybe_publish(self, now: float) -> None:
        if now >= self._next_publish:
            self._next_publish = now + PUBLISH_INTERVAL_S
            self.publish()

    def publish(self) -> None:
        serving = list(self.registry.serving())
        for s in serving:
            s.metrics.pending(s.queued)
        entries: list[tuple[str, int | None, bool]] = [(s.name, s.version, s.ready) for s in serving]
        entries += [(name, None, False) for name in self.registry.load_errors]
        self.health = HealthSnapshot.build(True, self.serving_ready(), entries)
        self.metrics.shm_bytes(self.regions.total_bytes())
        self.metrics.cache(self.caching.figures())
        records = []
        busy = self.pool.busy_since()
        for wp in self.supervisor.procs():
            state = self.pool.state_of(wp.identity)
            if state is None:
                continue
            up = "READY" if wp.identity in state.instances else "LOADING"
            spec = wp.spec
            records.append(
                WorkerRecord(
                    state.name,
                    state.version,
                    spec.instance,
                    wp.proc.pid,
                    spec.device,
                    up,
                    wp.incarnation - 1,
                    busy.get(wp.identity),
                )
            )
        self.worker_records = tuple(records)
        if self.frontdoors is not None:
            self.frontdoor_records = tuple(self.frontdoors())

    def status(self) -> dict[str, Any]:
        """The ``server_status`` answer (its shape is documented in ``status_view``)."""
        now = time.monotonic()
        procs = {wp.identity: wp for wp in self.supervisor.procs()}
        busy = self.pool.busy_since()
        now_ns = int(now * 1e9)
        models = []
        for s in sorted(self.registry.serving(), key=lambda s: (s.name, s.version)):
            ws = s.window.stats(now)
            instances = []
            for identity in self.pool.workers_of(s):
                wp = procs.get(identity)
                if wp is None:
                    continue
                instances.append(
                    {
                        "instance": wp.spec.instance,
                        "pid": wp.proc.pid,
                        "device": wp.spec.device,
                        "state": "READY" if identity in s.instances else "LOADING",
                        "restarts": wp.incarnation - 1,
                        "busy_s": (now_ns - busy[identity]) / 1e9 if identity in busy else None,
                        **_process_figures(wp.proc.pid),
                    }
                )
            models.append({
                "name": s.name, "version": s.version, "state": s.state(), "reason": s.error,
                "queue_depth": s.queued, "mean_batch_1m": ws.mean_batch,
                "p99_ms_1m": None if ws.p99_s is None else ws.p99_s * 1000, "rate_1m": ws.rate,
                "instances": sorted(instances, key=lambda i: i["instance"]),
            })  # fmt: skip
        for name, reason in sorted(self.registry.load_errors.items()):
            models.append({"name": name, "version": None, "state": "UNAVAILABLE", "reason": reason,
                           "queue_depth": 0, "rate_1m": 0.0, "instances": []})  # fmt: skip
        answer = {"server": {"pid": os.getpid(), "uptime_s": now - self.started, "ready": self.health.ready},
                  "models": models}  # fmt: skip
        if self.frontdoors is not None:
            answer["frontdoors"] = self.frontdoors()
        return answer

    def close(self) -> None:
        self.health = HealthSnapshot()
        if self.http is not None:
            self.http.stop()
        self.metrics.close()
        self.tracer.close()  # what is left of the trace file is written now


def _process_figures(pid: int) -> dict[str, Any]:
    try:
        p = psutil.Process(pid)
        cpu = p.cpu_times()
        return {"rss_bytes": p.memory_info().rss, "cpu_s": cpu.user + cpu.system}
    except psutil.Error:
        return {"rss_bytes": None, "cpu_s": None}
