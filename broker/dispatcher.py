"""Dispatch: batches out of the model queues onto free instances.

Each wake-up of the broker loop, ``dispatch`` asks the scheduler of each model with queued work
(``registry.working``) for what its free places take now (``Scheduler.pop_ready``: ``[(instance,
batches)]``), takes those places (``instance_pool``) and sends each as one EXECUTE
(``messages.execute_message``) through the outbox. Models whose schedulers take turns at rate-limiter
resources go through ``limited_dispatch`` instead, which hands back what each turn sends. ``dispatch_freed``
sends an eager model's next batch at once: when an instance's place came back (before the replies of its
batch are built) or a request filled a batch mid-turn. ``poll_timeout_ms`` tells the loop when the next
batch or queue deadline falls (``Scheduler.next_deadline``).

A request's path through the broker: admission (``admission``: checks; ``queues``: the response cache, the
schedulers), dispatch (here), completion (``completion``: results, replies, failures); ensembles run their
steps through all three (``ensemble_path``). The server builds each of them and hands each, through its
constructor, what it uses: completion first, then dispatch (which fails through completion a batch it
cannot send), then admission (which asks dispatch to send a batch that filled).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from zinfer.client.protocol import Command

from .batching.rate_limiter import RateLimiter
from .completion import Completion
from .instance_pool import InstancePool
from .limited_dispatch import LimitedDispatch, ModelKey
from .messages import execute_message, sequence_controls
from .model_state import ModelState
from .outbox import Outbox
from .regions import RegionTable
from .registry import ModelRegistry
from .scheduler import AnyBatch

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
            if state.idle and len(state.scheduler):
                if state.scheduler.takes_turns:
                    limited.append(state)
                else:
                    self._dispatch(state, now)
        if limited:
            for turn, worker, batches in self.limited.turns(limited, now):
                self.send(turn, worker, batches, now)  # before the next turn is decided

    def dispatch_freed(self, state: ModelState) -> None:
        """An instance of ``state`` just gave its place back, or a request filled a batch: its next batch
        leaves now, before the replies of the batch that ended are built, so the instance computes while
        the broker answers. Only where that changes no batch rule (``Scheduler.eager``): not for sequences
        (their next request waits for the last one's end) or rate-limited models (which take turns at
        resources in ``dispatch``)."""
        if state.scheduler.eager and state.idle and len(state.scheduler):
            self._dispatch(state, time.monotonic())

    def _dispatch(self, state: ModelState, now: float) -> None:
        if state.prefetching:
            self.pool.idle_first(state)
        for worker, batches in state.scheduler.pop_ready(now, state.idle):
            self.pool.take(state, worker)
            self.send(state, worker, batches, now)

    def send(
        self,
        state: ModelState,
        worker: bytes,
        batches: Sequence[AnyBatch],
        now: float,
    ) -> None:
        """One EXECUTE to ``worker``: a batch, or a run of several (each its own execution). The EXECUTE
        leaves first; the batch's statistics, metrics and latency window are recorded after it."""
        specs = state.scheduler.controls
        controls = sequence_controls(specs) if specs else ()
        items = batches[0].items if len(batches) == 1 else [p for b in batches for p in b.items]
        running = self.pool.start_batch(state, worker, items, time.monotonic_ns(), len(batches))
        message, frames = execute_message(
            running.batch_id, items, controls, self._region_wire, serial=len(batches) > 1
        )
        if not self.outbox.send_worker(worker, Command.W_EXECUTE, message, frames):
            self.pool.drop_batch(running.batch_id)
            self.completion.fail_batch(running, "the instance could not be reached")
        self._account(state, worker, batches, now)

    @staticmethod
    def _account(
        state: ModelState,
        worker: bytes,
        batches: Sequence[AnyBatch],
        now: float,
    ) -> None:
        """The figures of batches that just left: queue times, batch sizes and reasons, the queue's length."""
        debug = log.isEnabledFor(logging.DEBUG)
        stats = state.stats
        for batch in batches:
            oldest = now
            queued_ns = 0  # each request's queue time, added to the statistics at once (the same sums)
            for p in batch.items:
                queued_ns += int((now - p.arrival) * 1e9)
                if p.arrival < oldest:
                    oldest = p.arrival
            stats.queue.add(queued_ns, len(batch.items))
            reason = batch.reason.value  # an enum's ``value`` is interpreted code: asked once
            stats.record_batch(batch.size, reason)
            state.metrics.batch(batch.size, reason, (now - oldest) * 1e6)
            state.window.batch(now, batch.size)
            if debug:
                log.debug("event=batch model=%s size=%d requests=%d reason=%s worker=%s", state.name,
                          batch.size, len(batch.items), batch.reason.value, worker.decode())  # fmt: skip
        if debug and len(batches) > 1:
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
            sched = state.scheduler
            if sched.takes_turns:  # an instance waiting for its resources has no batch deadline
                idle: Sequence[bytes] = [w for w in state.idle if self.limiter.can_acquire(w)]
            else:
                idle = state.idle
            d = sched.next_deadline(idle)
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        if deadline is None:
            return float(MAX_POLL_MS)
        return max(0.0, min(float(MAX_POLL_MS), (deadline - time.monotonic()) * 1000))

    def queued(self) -> int:
        """Requests waiting for an instance, in every model (only those with work can have any)."""
        return sum(s.queued for s in self.registry.working())
