"""Request admission: an INFER is checked and queued, or answered at once.

``admit`` reads the request (``protocol.infer_from_wire``), finds its model version (``registry.resolve``),
checks every descriptor (``validation.check_request``) and its size against one batch's limit, then
``enqueue`` puts it where it goes: a stateful model's sequence batcher (bound to one instance at START), the
response cache (a hit is answered here, through request completion), an ensemble's first steps
(``ensemble_path``), or the model's dynamic batcher. Anything that cannot go in raises a ``ServerError``,
which the server answers. ``cancel`` takes a queued request out (or marks a running one, whose result is
then discarded) and ``expire`` answers the requests whose queue timeout passed.

What comes out of the queues is dispatch's (``dispatcher``); every answer goes through request completion
(``completion``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from zinfer.client import protocol
from zinfer.client.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    ServerError,
    Status,
    Unavailable,
)
from zinfer.client.protocol import Command, Frame, Reply
from zinfer.client.worker_protocol import CancelRequest, SequenceFlags, cancel_to_wire

from .batching.batcher import BatchTooLarge, InvalidPriority, QueuedRequest, QueueFull
from .batching.sequence_batcher import NotStarted, SequenceError, SequenceRequest, parse_sequence
from .cache_path import CachePath
from .completion import Completion
from .instance_pool import InstancePool
from .model_state import ModelState, Pending
from .regions import RegionTable
from .registry import ModelRegistry
from .tracing import Tracer
from .validation import check_request

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .ensemble_path import EnsemblePath

PRUNE_INTERVAL_S = 2.0  # how often mappings of unlinked client regions are dropped


class Admission:
    def __init__(
        self,
        registry: ModelRegistry,
        regions: RegionTable,
        completion: Completion,
        caching: CachePath,
        pool: InstancePool,
        draining: Callable[[], bool],
        max_tensor_bytes: int,
        max_batch_bytes: int,
    ) -> None:
        self.registry = registry
        self.regions = regions
        self.completion = completion
        self.caching = caching
        self.pool = pool
        self.draining = draining  # the server is draining: new requests are refused
        self.max_tensor_bytes = max_tensor_bytes
        self.max_batch_bytes = max_batch_bytes
        self.ensembles: EnsemblePath  # set by the server, which builds the ensembles' runner on admission
        # called with a model whose queue just reached a preferred batch size (``Dispatcher.dispatch_freed``)
        self.on_batch_ready: Callable[[ModelState], None] | None = None
        self._seq = itertools.count(1)
        self._next_prune = 0.0
        self.tracer = Tracer()  # the server's (shared with completion); off by default

    def admit(self, identity: bytes, header: dict[str, Any], frames: list[Frame]) -> None:
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
            next(self._seq), identity, req, frames, checked.outputs, checked.batch_size, now,
            input_bytes=checked.input_bytes,
        )  # fmt: skip
        if start_ns:
            p.trace = self.tracer.start(state.name, state.version, req.caller_id, req.parameters, start_ns)
        self.enqueue(state, p, checked.shape_key, now)
        state.metrics.bytes(checked.input_bytes, 0)
        # a batch may go now, not after the rest of this turn's messages; a model that executes each
        # request alone lets the turn's backlog gather instead, to go out in runs
        ready = self.on_batch_ready
        if ready is not None and state.idle and not state.runs:
            if state.batcher.reached_preferred(p.batch_size):
                ready(state)

    def enqueue(self, state: ModelState, p: Pending, shape_key: Hashable, now: float) -> None:
        """Queue a checked request: an ensemble's steps start, a sequence joins its instance's queue, a
        cached result answers at once, anything else joins the dynamic batcher. Raises a ServerError when
        it cannot go in (``p`` is then not queued and not answered)."""
        if state.sequencer is not None:
            self._admit_sequence(state, p, now)
            return
        if state.config.response_cache.enable and self._cache_lookup(state, p):
            return
        if state.ensemble is not None:
            if state.order is not None:
                state.order.submit(p.seq)
            self.ensembles.start(state, p, now)
            return
        queued = QueuedRequest(
            p, p.batch_size, shape_key, now, p.request.priority, p.request.timeout_us, p.input_bytes
        )
        try:
            batcher = state.batcher
            batcher.add(queued, now, batcher.needs_busy and self.pool.busy(state))
        except QueueFull as exc:
            state.metrics.rejected()
            raise Unavailable(str(exc)) from None
        except InvalidPriority as exc:
            raise InvalidArgument(str(exc)) from None
        except BatchTooLarge as exc:
            raise ResourceExhausted(str(exc)) from None
        self.registry.has_work(state)
        state.metrics.pending(state.queued)
        if state.order is not None:
            state.order.submit(p.seq)

    def _admit_sequence(self, state: ModelState, p: Pending, now: float) -> None:
        """Queue a request of a stateful model with its sequence (bound to one instance at START)."""
        assert state.sequencer is not None
        try:
            parsed = parse_sequence(p.request.parameters)
        except SequenceError as exc:
            raise InvalidArgument(str(exc)) from None
        if parsed is None:
            raise InvalidArgument(
                f"inference request to model '{state.name}' must specify a non-zero or non-empty sequence_id"
            )
        sid, start, end = parsed
        if isinstance(sid, str):
            for c in state.controls:
                if c["kind"] == "CORRID" and c["data_type"] != "TYPE_STRING":
                    raise InvalidArgument(
                        f"inference request for sequence '{sid}' to model '{state.name}': a string "
                        f"sequence_id needs the CORRID control '{c['name']}' to be TYPE_STRING, the model "
                        f"has {c['data_type']}"
                    )  # never a made-up id: the model would see 0 for every such sequence
        if state.signature.batching and p.batch_size != 1:
            raise InvalidArgument(f"a sequence request must hold one row, got a batch of {p.batch_size}")
        p.sequence = SequenceFlags(sid, start, end)
        try:
            state.sequencer.add(SequenceRequest(p, sid, start, end, now), now, sorted(state.instances))
            self.registry.has_work(state)
        except NotStarted as exc:  # Triton's text, which clients match on
            raise InvalidArgument(
                f"inference request for sequence {exc.sequence_id} to model '{state.name}' must specify "
                "the START flag on the first request of the sequence"
            ) from None
        except SequenceError as exc:
            raise InvalidArgument(str(exc)) from None
        state.metrics.pending(state.queued)
        if state.order is not None:
            state.order.submit(p.seq)

    def new_seq(self) -> int:
        """A number for a request the broker makes itself (an ensemble step)."""
        return next(self._seq)

    def _cache_lookup(self, state: ModelState, p: Pending) -> bool:
        """Answer ``p`` from the cache if it can (True); on a miss, mark it to be stored when it succeeds."""
        hit = self.caching.lookup(state, p)
        if hit is None:
            return False
        wire, frames, lookup_ns = hit
        stats = state.stats
        now = time.monotonic()
        duration = int((now - p.arrival) * 1e9) + lookup_ns
        body = {"model": state.name, "version": state.version, "outputs": wire}
        if state.order is not None:
            state.order.submit(p.seq)
        self.completion.reply(state, p, Reply(p.request.request_id, Status.OK, body=body), frames)
        stats.record_success(duration)  # counted once the reply has left
        stats.last_inference_ms = int(time.time() * 1000)
        state.metrics.success(duration / 1000, 0.0, 0)  # a hit is a success, but no inference ran
        state.window.record(now, duration / 1e9)
        return True

    def cancel(self, identity: bytes, target: str) -> str:
        """Cancel the caller's request ``target``: out of the queue, or its result discarded if it runs."""
        for state in self.registry.working():  # a queued request is in a state with work
            removed = state.batcher.remove(lambda p: p.client == identity and p.request.request_id == target)
            if state.sequencer is not None:
                removed += state.sequencer.remove(
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
            queued = state.batcher.remove(lambda _: True)
            if state.sequencer is not None:
                queued += state.sequencer.remove(lambda _: True)
            for p in queued:
                state.metrics.failure("OTHER")
                self.completion.finish_early(state, p, error)

    def expire(self, now: float) -> None:
        """Answer the requests whose queue timeout has passed, whether or not an instance is free."""
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL_S
            self.caching.readers.prune()
        for state in self.registry.working():
            seqs = state.sequencer
            if seqs is not None:
                due_seq = seqs.next_expiry()
                if due_seq is not None and due_seq <= now:
                    before = seqs.active()
                    seqs.expire(now)  # idle sequences are released; none of them has a queued request
                    if seqs.active() < before:
                        log.info("event=sequences_released model=%s reason=idle count=%d",
                                 state.name, before - seqs.active())
            due = state.batcher.next_expiry()
            if due is None or due > now:
                continue
            for p in state.batcher.expire(now):
                state.metrics.timed_out()
                state.stats.fail.add(int((now - p.arrival) * 1e9))
                self.completion.finish_early(state, p, DeadlineExceeded("Request timeout expired"))
