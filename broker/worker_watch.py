"""Watching the worker processes: heartbeats, deaths, and restarts.

A worker is dead when its process exits or when its heartbeats stop for ``liveness`` intervals (it is then
killed). Either way its in-flight batch fails with Unavailable at once, its model loses the instance, and
the restart policy brings it back, unless it never got through loading (a load failure) or its model is
retiring.

A worker that heartbeats but is stuck in one batch (a model in a busy loop) is killed the same way once
that batch has run past its model's execution limit (``execution_limit``): the batch fails with
DeadlineExceeded first, then the worker is reaped and restarted like any other.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .execution_limit import overdue

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger(__name__)

STARTUP_GRACE_S = 60.0  # longest a new worker may take to send its first heartbeat


class WorkerWatch:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._last_heartbeat: dict[bytes, float] = {}
        self._ever_ready: set[bytes] = set()
        self._killed_late: set[bytes] = set()  # killed for a batch past the execution limit, not yet reaped

    def heartbeat(self, worker: bytes, now: float) -> None:
        self._last_heartbeat[worker] = now

    def ready(self, worker: bytes) -> None:
        self._ever_ready.add(worker)

    def check_heartbeats(self, now: float) -> None:
        """Kill workers whose heartbeats stopped (frozen or wedged); reaping then fails their batch."""
        b = self.b
        limit = b.options.heartbeat_interval_s * b.options.heartbeat_liveness
        for wp in b.supervisor.procs():
            seen = self._last_heartbeat.get(wp.identity)
            # before its first heartbeat a worker is still starting Python: a slow box gets time for that
            last, allowed = (seen, limit) if seen is not None else (wp.started, max(limit, STARTUP_GRACE_S))
            if now - last > allowed and wp.identity in b.worker_model:
                log.error("event=worker_unresponsive worker=%s silent_s=%.1f", wp.identity, now - last)
                self._last_heartbeat[wp.identity] = now  # once: reaping follows
                b.supervisor.kill(wp.identity)

    def check_execution(self, now_ns: int) -> None:
        """Fail the batches running past their model's execution limit and kill their workers."""
        b = self.b
        late = [x for x in overdue(b.path.inflight.values(), now_ns) if x.worker not in self._killed_late]
        for batch in late:
            state, worker = batch.model, batch.worker
            log.error(
                "event=execution_timeout model=%s version=%d worker=%s limit_ms=%d running_ms=%d requests=%d",
                state.name, state.version, worker.decode(), (state.execution_limit_ns or 0) // 1_000_000,
                (now_ns - batch.sent_ns) // 1_000_000, len(batch.requests),
            )  # fmt: skip
            b.path.time_out_batch(batch, now_ns - batch.sent_ns)
            while worker in state.idle:  # a prefetching worker's second place: no new batch for it
                state.idle.remove(worker)
            self._killed_late.add(worker)
            b.supervisor.kill(worker)

    def reap(self, now: float) -> None:
        b = self.b
        self.check_heartbeats(now)
        self.check_execution(int(now * 1e9))
        for wp, code in b.supervisor.reap():
            state = b.worker_model.pop(wp.identity, None)
            self._last_heartbeat.pop(wp.identity, None)
            self._killed_late.discard(wp.identity)
            ever_ready = wp.identity in self._ever_ready
            self._ever_ready.discard(wp.identity)
            if state is None:
                continue
            if not ever_ready and state.error is None and not state.instances:
                state.error = f"worker exited with code {code} while loading the model (see the log)"
            state.instances.discard(wp.identity)
            while wp.identity in state.idle:  # a prefetching worker has two places
                state.idle.remove(wp.identity)
            b.path.fail_worker(wp.identity, f"worker exited with code {code}")
            who = wp.identity.decode()
            log.warning("event=worker_exited model=%s worker=%s code=%d", state.name, who, code)
            if state.error is not None or state.retired:
                continue  # a load failure, or a state on its way out: do not restart
            crashes = b.restarts.crashed(wp.spec, now)
            if crashes is not None:
                state.error = f"worker crashed {crashes} times in a minute (last exit code {code})"
                log.error("event=instance_failed model=%s error=%r", state.name, state.error)
        for spec in b.restarts.due(now):
            b.spawn(spec)
