"""Dispatch: batches out of the model queues onto free instances.

Each wake-up of the broker loop, ``dispatch`` asks the batcher (or sequence batcher) of each model with
queued work (``registry.working``) for the batches its free places can take (``instance_pool``), and
``execute`` sends each as an EXECUTE (``messages.execute_message``) through the outbox; models whose
instance groups name resources take turns at them instead (``limited_dispatch``, handed ``execute``).
``poll_timeout_ms`` tells the loop when the next batch or queue deadline falls.

A request's path through the broker: admission (``admission``: checks, the response cache, the queues),
dispatch (here), completion (``completion``: results, replies, failures); ensembles run their steps through
all three (``ensemble_path``). The server builds each of them and hands each what it uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from zinfer.client.protocol import Command
from zinfer.client.worker_protocol import execute_to_wire

from .batching.batcher import Batch
from .batching.rate_limiter import RateLimiter
from .batching.runs import run_length, run_targets, split_runs
from .batching.sequence_batcher import SequenceBatch
from .completion import Completion
from .instance_pool import InstancePool
from .limited_dispatch import LimitedDispatch, ModelKey
from .messages import execute_message, sequence_controls
from .model_state import ModelState, Pending
from .outbox import Outbox
from .regions import RegionTable
from .registry import ModelRegistry

log = logging.getLogger(__name__)

MAX_POLL_MS = 100


class Dispatcher:
    def __init__(
        self,
        registry: ModelRegistry,
        regions: RegionTable,
        pool: InstancePool,
        outbox: Outbox,
        completion: Completion,
        limiter: RateLimiter[bytes, ModelKey],
        limited: LimitedDispatch,
    ) -> None:
        self.registry = registry
        self.regions = regions  # how a worker reaches each client region a batch names
        self.pool = pool
        self.outbox = outbox
        self.completion = completion  # a batch its instance cannot be sent fails there
        self.limiter = limiter
        self.limited = limited  # models whose instances take turns at resources

    # ------------------------------------------------------------------------------------ batches

    def dispatch(self, now: float) -> None:
        limited: list[ModelState] = []
        for state in self.registry.working():
            seqs = state.sequencer
            if seqs is not None:
                if state.idle and len(seqs):
                    if state.rate_limited:
                        limited.append(state)
                        continue
                    for worker, sbatch in seqs.pop_ready(now, list(state.idle)):
                        self.pool.take(state, worker)
                        self.execute(state, worker, sbatch, now)
                continue
            if state.idle and len(state.batcher):
                if state.rate_limited:
                    limited.append(state)
                    continue
                self._dispatch_batches(state, now)
        if limited:
            self.limited.dispatch(limited, now, self.execute)

    def dispatch_freed(self, state: ModelState) -> None:
        """An instance of ``state`` just gave its place back: its next batch leaves now, before the replies
        of the batch that ended are built, so the instance computes while the broker answers. Only where
        that changes no batch rule: not for sequences (their next request waits for the last one's end) or
        rate-limited models (which take turns at resources in ``dispatch``)."""
        if state.sequencer is None and not state.rate_limited and state.idle and len(state.batcher):
            self._dispatch_batches(state, time.monotonic())

    def _dispatch_batches(self, state: ModelState, now: float) -> None:
        if state.prefetching:
            self.pool.idle_first(state)
        if state.runs and self._dispatch_runs(state, now):
            return
        for batch in state.batcher.pop_ready(now, len(state.idle)):
            self.execute(state, self.pool.take_next(state), batch, now)

    def runnable(self, state: ModelState) -> bool:
        """Whether an idle instance of ``state`` could take a batch now (its resources are free)."""
        if not state.rate_limited:
            return bool(state.idle)
        return any(self.limiter.can_acquire(w) for w in state.idle)

    def _dispatch_runs(self, state: ModelState, now: float) -> bool:
        """A backlog of a model that executes each request alone: each instance with a free place takes a
        run of it (``batching.runs``), one EXECUTE for several executions. False (nothing sent) when the
        queue is no longer than those instances: each request then goes alone. Instances running nothing
        (both their places free) take the backlog first, as a batcher gives it to a free instance; a busy
        one's second place takes a run only while no instance is free."""
        instances = run_targets(state.idle)
        if len(state.batcher) <= len(instances):
            return False
        length = run_length(len(state.batcher), len(instances), state.cost.ns)
        runs = split_runs(state.batcher.pop_ready(now, length * len(instances)), length)
        for worker, run in zip(instances, runs, strict=False):
            self.pool.take(state, worker)
            self._send(state, worker, run, now)
        return True

    def execute(
        self, state: ModelState, worker: bytes, batch: Batch[Pending] | SequenceBatch[Pending], now: float
    ) -> None:
        self._send(state, worker, [batch], now)

    def _send(
        self,
        state: ModelState,
        worker: bytes,
        batches: Sequence[Batch[Pending] | SequenceBatch[Pending]],
        now: float,
    ) -> None:
        """One EXECUTE to ``worker``: a batch, or a run of several (each its own execution). The EXECUTE
        leaves first; the batch's statistics, metrics and latency window are recorded after it."""
        controls = sequence_controls(state.controls) if state.controls else ()
        items = batches[0].items if len(batches) == 1 else [p for b in batches for p in b.items]
        running = self.pool.start_batch(state, worker, items, time.monotonic_ns(), len(batches))
        message, frames = execute_message(
            running.batch_id, items, controls, self._region_wire, serial=len(batches) > 1
        )
        if not self.outbox.send_worker(worker, Command.W_EXECUTE, execute_to_wire(message), frames):
            self.pool.drop_batch(running.batch_id)
            self.completion.fail_batch(running, "the instance could not be reached")
        self._account(state, worker, batches, now)

    @staticmethod
    def _account(
        state: ModelState,
        worker: bytes,
        batches: Sequence[Batch[Pending] | SequenceBatch[Pending]],
        now: float,
    ) -> None:
        """The figures of batches that just left: queue times, batch sizes and reasons, the queue's length."""
        for batch in batches:
            oldest = now
            for p in batch.items:
                state.stats.queue.add(int((now - p.arrival) * 1e9))
                oldest = min(oldest, p.arrival)
            state.stats.record_batch(batch.size, batch.reason.value)
            state.metrics.batch(batch.size, batch.reason.value, (now - oldest) * 1e6)
            state.window.batch(now, batch.size)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("event=batch model=%s size=%d requests=%d reason=%s worker=%s", state.name,
                          batch.size, len(batch.items), batch.reason.value, worker.decode())  # fmt: skip
        if len(batches) > 1 and log.isEnabledFor(logging.DEBUG):
            log.debug("event=run model=%s executions=%d worker=%s", state.name, len(batches), worker.decode())
        state.metrics.pending(state.queued)  # the batch left the queue

    def _region_wire(self, name: str) -> list[int] | None:
        region = self.regions.get(name)
        return None if region is None else region.wire()

    def poll_timeout_ms(self) -> float:
        """Milliseconds until the nearest batch deadline (models with an idle instance) or queue timeout;
        only the states with work (``registry.working``) can have one."""
        deadline: float | None = None
        for state in self.registry.working():
            if state.sequencer is not None:  # an instance waiting for its resources has no batch deadline
                limiter = self.limiter
                idle = [w for w in state.idle if not state.rate_limited or limiter.can_acquire(w)]
                d = state.sequencer.next_deadline(idle)
            else:
                d = state.batcher.next_deadline() if self.runnable(state) else state.batcher.next_expiry()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        if deadline is None:
            return float(MAX_POLL_MS)
        return max(0.0, min(float(MAX_POLL_MS), (deadline - time.monotonic()) * 1000))

    def queued(self) -> int:
        """Requests waiting for an instance, in every model (only those with work can have any)."""
        return sum(s.queued for s in self.registry.working())
