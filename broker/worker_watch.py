"""Watching the worker processes: heartbeats, deaths, and restarts.

A worker is dead when its process exits or when its heartbeats stop for ``liveness`` intervals (it is then
killed). Either way its in-flight batch fails with Unavailable at once, its model loses the instance, and
the restart policy brings it back, unless it never got through loading (a load failure) or its model is
retiring.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger(__name__)

STARTUP_GRACE_S = 60.0  # longest a new worker may take to send its first heartbeat


class WorkerWatch:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._last_heartbeat: dict[bytes, float] = {}
        self._ever_ready: set[bytes] = set()

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

    def reap(self, now: float) -> None:
        b = self.b
        self.check_heartbeats(now)
        for wp, code in b.supervisor.reap():
            state = b.worker_model.pop(wp.identity, None)
            self._last_heartbeat.pop(wp.identity, None)
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
