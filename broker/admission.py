"""Request admission: an INFER is checked and queued, or answered at once.

``admit`` reads the request (``protocol.infer_from_wire``), finds its model version (``registry.resolve``),
checks every descriptor (``validation.check_request``) and its size against one batch's limit, then hands
it to queueing (``queues.Queues.enqueue``: the response cache, or the model's scheduler) or, for an
ensemble, to the ensembles' runner (``ensemble_path``), which starts its first steps. Anything that cannot
go in raises a ``ServerError``, which the server answers. A request that takes its model's queue to a
preferred batch size lets a batch leave at once (``Dispatcher.dispatch_freed``). ``cancel`` takes a queued
request out (or marks a running one, whose result is then discarded) and ``expire`` answers the requests
whose queue timeout passed.

What comes out of the queues is dispatch's (``dispatcher``); every answer goes through request completion
(``completion``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from zinfer.client import protocol
from zinfer.client.errors import (
    Cancelled,
    DeadlineExceeded,
    ResourceExhausted,
    ServerError,
    Unavailable,
)
from zinfer.client.protocol import Command, Frame
from zinfer.client.worker_protocol import CancelRequest, cancel_to_wire

from .cache_path import CachePath
from .completion import Completion
from .dispatcher import Dispatcher
from .ensemble_path import EnsemblePath
from .instance_pool import InstancePool
from .model_state import Pending
from .queues import Queues
from .regions import RegionTable
from .registry import ModelRegistry
from .tracing import Tracer
from .validation import check_request

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 2.0  # how often mappings of unlinked client regions are dropped


class Admission:
    def __init__(
        self,
        registry: ModelRegistry,
        regions: RegionTable,
        queues: Queues,
        ensembles: EnsemblePath,
        dispatcher: Dispatcher,
        completion: Completion,
        caching: CachePath,
        pool: InstancePool,
        tracer: Tracer,
        draining: Callable[[], bool],
        max_tensor_bytes: int,
        max_batch_bytes: int,
    ) -> None:
        self.registry = registry
        self.regions = regions
        self.queues = queues  # a checked request joins its model's queue (or the cache answers it)
        self.ensembles = ensembles  # an ensemble's request starts its steps
        self.dispatcher = dispatcher  # a batch that filled mid-turn leaves at once
        self.completion = completion
        self.caching = caching
        self.pool = pool
        self.tracer = tracer  # the server's per-request traces; off by default
        self.draining = draining  # the server is draining: new requests are refused
        self.max_tensor_bytes = max_tensor_bytes
        self.max_batch_bytes = max_batch_bytes
        self._next_prune = 0.0

    def admit(self, identity: bytes, header: protocol.Header, frames: list[Frame]) -> None:
        """Check a request and queue it; raises a ServerError (answered at once) when it cannot go in."""
        if self.draining():
            raise Unavailable("the server is shutting down")
        start_ns = time.monotonic_ns() if self.tracer.on else 0
        req = protocol.infer_from_wire(header)
        state = self.registry.resolve(req.model, req.version)
        if not state.ready:
            state.metrics.rejected()
            reason = state.error or "no instance is ready yet"
            what = (
                f"version {state.version} is not at ready state"
                if req.version
                else "has no available versions"
            )
            raise Unavailable(f"Request for unknown model: '{state.name}' {what}: {reason}")
        checked = check_request(req, frames, state.signature, self.regions, identity, self.max_tensor_bytes)
        if checked.input_bytes > self.max_batch_bytes:  # no batch could hold it: refused before queueing
            raise ResourceExhausted(
                f"the request's inputs of {checked.input_bytes} bytes are over the "
                f"{self.max_batch_bytes} byte limit of one batch (--max-batch-bytes)"
            )
        now = time.monotonic()
        p = Pending(
            next(self.queues.seqs), identity, req, frames, checked.outputs, checked.batch_size, now,
            input_bytes=checked.input_bytes,
        )  # fmt: skip
        if start_ns:
            p.trace = self.tracer.start(state.name, state.version, req.caller_id, req.parameters, start_ns,
                                        req, frames)  # fmt: skip
        try:
            if not self.queues.enqueue(state, p, checked.shape_key, now):
                self.ensembles.start(state, p, now)
        except ServerError as exc:
            if p.trace is not None:  # refused once its trace began (queue full, bad sequence flags)
                self.tracer.refused(p.trace, exc.status)
            raise
        state.metrics.bytes(checked.input_bytes, 0)
        # a batch may go now, not after the rest of this turn's messages; a model that executes each
        # request alone lets the turn's backlog gather instead, to go out in runs (``Runs.ready_now``)
        if state.idle and state.scheduler.ready_now(p.batch_size):
            self.dispatcher.dispatch_freed(state)

    def cancel(self, identity: bytes, target: str) -> str:
        """Cancel the caller's request ``target``: out of the queue, or, if it runs, its result discarded
        (a decoupled model's stream goes on as the model sends it: it decides how to end it, as in Triton)."""
        for state in self.registry.working():  # a queued request is in a state with work
            removed = state.scheduler.remove(
                lambda p: p.client == identity and p.request.request_id == target
            )
            for p in removed:
                self.completion.finish_early(state, p, Cancelled("the request was cancelled"))
                state.metrics.cancelled()
                return "queued"
        for batch in self.pool.running():
            for p in batch.requests:
                if p.client == identity and p.request.request_id == target and not p.cancelled:
                    p.cancelled = True
                    # the model may look (Triton's request.is_cancelled()) and end it early
                    cancel = cancel_to_wire(CancelRequest(batch.batch_id, p.seq))
                    self.completion.outbox.send_worker(batch.worker, Command.W_CANCEL, cancel)
                    return "running"
        return "unknown"

    def fail_queued(self, error: ServerError) -> None:
        """Answer every queued request with ``error`` (the server is stopping)."""
        for state in self.registry.states():
            queued = state.scheduler.remove(lambda _: True)
            for p in queued:
                state.metrics.failure("OTHER")
                self.completion.finish_early(state, p, error)

    def expire(self, now: float) -> None:
        """Answer the requests whose queue timeout has passed, whether or not an instance is free."""
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL_S
            self.caching.readers.prune()
        for state in self.registry.working():
            sched = state.scheduler
            due = sched.next_expiry()
            if due is None or due > now:
                continue
            before = sched.active()
            expired = sched.expire(now)  # a stateful model's idle sequences are released
            if sched.active() < before:
                log.info("event=sequences_released model=%s reason=idle count=%d",
                         state.name, before - sched.active())  # fmt: skip
            for p in expired:
                state.metrics.timed_out()
                state.stats.fail.add(int((now - p.arrival) * 1e9))
                self.completion.finish_early(state, p, DeadlineExceeded("Request timeout expired"))
