"""Watching the worker processes: heartbeats, deaths, and restarts.

A worker is dead when its process exits or when its heartbeats stop for ``liveness`` intervals (it is then
killed). Either way its in-flight batch fails with Unavailable at once, its model loses the instance, and
the restart policy brings it back, unless it never got through loading (a load failure) or its model is
retiring.

A worker that heartbeats but is stuck in one batch (a model in a busy loop) is killed the same way once
that batch has run past its model's execution limit (``execution_limit``): the batch fails with
DeadlineExceeded first, then the worker is reaped and restarted like any other.

What it knows of the workers is the instance pool's (``instance_pool``); what it does to their requests is
request completion's (``time_out_batch``, ``fail_worker``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .instance_pool import InstancePool
from .model_state import InFlight
from .supervisor import RestartPolicy, Supervisor, WorkerSpec

log = logging.getLogger(__name__)


class Failures(Protocol):
    """What becomes of the requests of a batch or a worker that will not finish (request completion)."""

    def time_out_batch(self, batch: InFlight, running_ns: int) -> None: ...

    def fail_worker(self, worker: bytes, why: str) -> None: ...


class WorkerWatch:
    def __init__(
        self,
        pool: InstancePool,
        supervisor: Supervisor,
        restarts: RestartPolicy,
        failures: Failures,
        spawn: Callable[[WorkerSpec], None],
    ) -> None:
        self.pool = pool
        self.supervisor = supervisor
        self.restarts = restarts
        self.failures = failures
        self.spawn = spawn
        self._killed_late: set[bytes] = set()  # killed for a batch past the execution limit, not yet reaped

    def check_heartbeats(self, now: float) -> None:
        """Kill workers whose heartbeats stopped (frozen or wedged); reaping then fails their batch."""
        for worker, silent_s in self.pool.silent(now):
            log.error("event=worker_unresponsive worker=%s silent_s=%.1f", worker, silent_s)
            self.supervisor.kill(worker)

    def check_execution(self, now_ns: int) -> None:
        """Fail the batches running past their model's execution limit and kill their workers."""
        late = [x for x in self.pool.overdue(now_ns) if x.worker not in self._killed_late]
        for batch in late:
            state, worker = batch.model, batch.worker
            log.error(
                "event=execution_timeout model=%s version=%d worker=%s limit_ms=%d running_ms=%d requests=%d",
                state.name, state.version, worker.decode(), (state.execution_limit_ns or 0) // 1_000_000,
                (now_ns - batch.sent_ns) // 1_000_000, len(batch.requests),
            )  # fmt: skip
            self.failures.time_out_batch(batch, now_ns - batch.sent_ns)
            self.pool.withdraw(state, worker)  # a prefetching worker's second place: no new batch for it
            self._killed_late.add(worker)
            self.supervisor.kill(worker)

    def reap(self, now: float) -> None:
        self.check_heartbeats(now)
        self.check_execution(int(now * 1e9))
        for wp, code in self.supervisor.reap():
            self._killed_late.discard(wp.identity)
            state, ever_ready = self.pool.remove(wp.identity)
            if state is None:
                continue
            reported = state.error is not None  # a load failure the worker reported (logged once already)
            if not ever_ready and state.error is None and not state.instances:
                state.error = f"worker exited with code {code} while loading the model (see the log)"
            self.failures.fail_worker(wp.identity, f"worker exited with code {code}")
            who = wp.identity.decode()
            # expected exits are INFO: a retired worker told to stop (a reload, an unload) and one whose
            # load failure is already logged (event=model_load_failed); a crash is a WARNING
            expected = (code == 0 and state.retired) or (not ever_ready and reported)
            log.log(logging.INFO if expected else logging.WARNING,
                    "event=worker_exited model=%s worker=%s code=%d", state.name, who, code)  # fmt: skip
            if state.error is not None or state.retired:
                continue  # a load failure, or a state on its way out: do not restart
            crashes = self.restarts.crashed(wp.spec, now)
            if crashes is not None:
                state.error = f"worker crashed {crashes} times in a minute (last exit code {code})"
                log.error("event=instance_failed model=%s error=%r", state.name, state.error)
        for spec in self.restarts.due(now):
            self.spawn(spec)
