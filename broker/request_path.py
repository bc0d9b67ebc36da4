"""The path of an inference request through the broker: admission, queueing, timeouts, cancellation,
batching onto idle instances, and the replies (in arrival order where the model asks for it).

Two optional stops on the way: the response cache (a request seen before is answered at admission, a
miss stores its result before the reply goes, ``cache_path``) and the rate limiter (an instance of a model
whose instance groups name resources gets a batch only when those resources are free; models take turns at
them, ``limited_dispatch``). Ensembles run their steps through here too (``ensemble_path``)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Hashable
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
from zinfer.client.worker_protocol import WorkerResult, execute_to_wire

from .batching.batcher import Batch, BatchTooLarge, InvalidPriority, QueuedRequest, QueueFull
from .batching.sequence_batcher import SequenceBatch, SequenceError, SequenceRequest, parse_sequence
from .cache_path import CachePath
from .ensemble_path import EnsemblePath
from .limited_dispatch import LimitedDispatch
from .messages import client_outputs, execute_message, sequence_controls
from .model_state import InFlight, ModelState, Pending
from .validation import check_request

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger(__name__)

MAX_POLL_MS = 100
PRUNE_INTERVAL_S = 2.0  # how often mappings of unlinked client regions are dropped


class RequestPath:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.outbox = broker.outbox
        self.pool = broker.pool
        self._seq = itertools.count(1)
        opts = broker.options
        self.caching = CachePath(opts.cache_bytes)
        self.cache = self.caching.cache
        self.readers = self.caching.readers  # client regions mapped read-only, for the cache
        self.readers.open_client = broker.regions.map_readonly
        self.limited = LimitedDispatch(self, opts.rate_limit_resources)
        self.limiter = self.limited.limiter
        self.ensembles = EnsemblePath(self)
        self._next_prune = 0.0

    # ------------------------------------------------------------------------------------ admission

    def admit(self, identity: bytes, header: dict[str, Any], frames: list[Frame]) -> None:
        """Check a request and queue it; raises a ServerError (answered at once) when it cannot go in."""
        b = self.b
        if b.draining_since is not None:
            raise Unavailable("the server is shutting down")
        req = protocol.infer_from_wire(header)
        state = b.registry.resolve(req.model, req.version)
        if not state.ready:
            state.metrics.rejected()
            reason = state.error or "no instance is ready yet"
            raise Unavailable(f"model '{state.name}' version {state.version} is not ready: {reason}")
        checked = check_request(req, frames, state.signature, b.regions, identity, b.options.max_tensor_bytes)
        if checked.input_bytes > b.options.max_batch_bytes:  # no batch could hold it: refused before queueing
            raise ResourceExhausted(
                f"the request's inputs of {checked.input_bytes} bytes are over the "
                f"{b.options.max_batch_bytes} byte limit of one batch (--max-batch-bytes)"
            )
        now = time.monotonic()
        outputs = header["outputs"] if req.outputs is not None else [
            protocol.output_to_wire(o) for o in checked.outputs
        ]  # fmt: skip
        p = Pending(
            next(self._seq), identity, req, frames, header["inputs"], outputs, checked.batch_size, now,
            input_bytes=checked.input_bytes,
        )  # fmt: skip
        self.enqueue(state, p, checked.shape_key, now)
        state.metrics.bytes(checked.input_bytes, 0)

    def enqueue(self, state: ModelState, p: Pending, shape_key: Hashable, now: float) -> None:
        """Queue a checked request: an ensemble's steps start, a sequence joins its instance's queue, a
        cached result answers at once, anything else joins the dynamic batcher. Raises a ServerError when
        it cannot go in (``p`` is then not queued and not answered)."""
        if state.sequencer is not None:
            self._admit_sequence(state, p, now)
            return
        if state.config.response_cache.enable and self._cache_lookup(state, p, p.wire_outputs):
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
            state.batcher.add(queued, now)
        except QueueFull as exc:
            state.metrics.rejected()
            raise Unavailable(str(exc)) from None
        except InvalidPriority as exc:
            raise InvalidArgument(str(exc)) from None
        except BatchTooLarge as exc:
            raise ResourceExhausted(str(exc)) from None
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
        if state.signature.batching and p.batch_size != 1:
            raise InvalidArgument(f"a sequence request must hold one row, got a batch of {p.batch_size}")
        p.sequence = {"id": sid, "start": start, "end": end}
        try:
            state.sequencer.add(SequenceRequest(p, sid, start, end, now), now, sorted(state.instances))
        except SequenceError as exc:
            raise InvalidArgument(str(exc)) from None
        if state.order is not None:
            state.order.submit(p.seq)

    def new_seq(self) -> int:
        """A number for a request the broker makes itself (an ensemble step)."""
        return next(self._seq)

    # ------------------------------------------------------------------------------------ response cache

    def _cache_lookup(self, state: ModelState, p: Pending, outputs: list[dict[str, Any]]) -> bool:
        """Answer ``p`` from the cache if it can (True); on a miss, mark it to be stored when it succeeds."""
        hit = self.caching.lookup(state, p, outputs)
        if hit is None:
            return False
        wire, frames, lookup_ns = hit
        stats = state.stats
        now = time.monotonic()
        duration = int((now - p.arrival) * 1e9) + lookup_ns
        stats.record_success(duration)
        stats.last_inference_ms = int(time.time() * 1000)
        state.metrics.success(duration / 1000, 0.0, 0)  # a hit is a success, but no inference ran
        state.window.record(now, duration / 1e9)
        body = {"model": state.name, "version": state.version, "outputs": wire}
        if state.order is not None:
            state.order.submit(p.seq)
        self._reply(state, p, Reply(p.request.request_id, Status.OK, body=body), frames)
        return True

    # ------------------------------------------------------------------------------------ cancel, expire

    def cancel(self, identity: bytes, target: str) -> str:
        """Cancel the caller's request ``target``: out of the queue, or its result discarded if it runs."""
        for state in self.b.registry.states():
            removed = state.batcher.remove(lambda p: p.client == identity and p.request.request_id == target)
            if state.sequencer is not None:
                removed += state.sequencer.remove(
                    lambda p: p.client == identity and p.request.request_id == target
                )
            for p in removed:
                self.finish_early(state, p, Cancelled("the request was cancelled"))
                state.metrics.cancelled()
                return "queued"
        for batch in self.pool.running():
            for p in batch.requests:
                if p.client == identity and p.request.request_id == target and not p.cancelled:
                    p.cancelled = True
                    return "running"
        return "unknown"

    def expire(self, now: float) -> None:
        """Answer the requests whose queue timeout has passed, whether or not an instance is free."""
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL_S
            self.readers.prune()
        for state in self.b.registry.states():
            seqs = state.sequencer
            if seqs is not None:
                due_seq = seqs.next_expiry()
                if due_seq is not None and due_seq <= now:
                    seqs.expire(now)  # idle sequences are released; none of them has a queued request
            due = state.batcher.next_expiry()
            if due is None or due > now:
                continue
            for p in state.batcher.expire(now):
                state.metrics.timed_out()
                state.stats.fail.add(int((now - p.arrival) * 1e9))
                self.finish_early(state, p, DeadlineExceeded("Request timeout expired"))

    # ------------------------------------------------------------------------------------ batches

    def dispatch(self, now: float) -> None:
        limited: list[ModelState] = []
        for state in self.b.registry.states():
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
                if state.prefetching:
                    self.pool.idle_first(state)
                for batch in state.batcher.pop_ready(now, len(state.idle)):
                    self.execute(state, self.pool.take_next(state), batch, now)
        if limited:
            self.limited.dispatch(limited, now)

    def runnable(self, state: ModelState) -> bool:
        """Whether an idle instance of ``state`` could take a batch now (its resources are free)."""
        if not state.rate_limited:
            return bool(state.idle)
        return any(self.limiter.can_acquire(w) for w in state.idle)

    def execute(
        self, state: ModelState, worker: bytes, batch: Batch[Pending] | SequenceBatch[Pending], now: float
    ) -> None:
        oldest = now
        for p in batch.items:
            state.stats.queue.add(int((now - p.arrival) * 1e9))
            oldest = min(oldest, p.arrival)
        state.stats.record_batch(batch.size, batch.reason.value)
        state.metrics.batch(batch.size, batch.reason.value, (now - oldest) * 1e6)
        state.window.batch(now, batch.size)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("event=batch model=%s size=%d requests=%d reason=%s worker=%s", state.name, batch.size,
                      len(batch.items), batch.reason.value, worker.decode())  # fmt: skip
        controls = sequence_controls(state.controls) if state.controls else ()
        running = self.pool.start_batch(state, worker, batch.items, time.monotonic_ns())
        message, frames = execute_message(running.batch_id, batch.items, controls, self._region_wire)
        if not self.outbox.send_worker(worker, Command.W_EXECUTE, execute_to_wire(message), frames):
            self.pool.drop_batch(running.batch_id)
            self.fail_batch(running, "the instance could not be reached")

    def _region_wire(self, name: str) -> list[int] | None:
        region = self.b.regions.get(name)
        return None if region is None else region.wire()

    def _sequences_done(self, state: ModelState, requests: list[Pending]) -> None:
        """The requests of a batch finished: their sequences may send the next one (or close)."""
        if state.sequencer is not None:
            ids = [p.sequence["id"] for p in requests if p.sequence is not None]
            state.sequencer.done(ids, time.monotonic())

    def fail_batch(self, batch: InFlight, why: str, error: ServerError | None = None) -> None:
        """Answer every request of a batch that will not finish with ``error`` (default: Unavailable)."""
        self.limiter.release(batch.worker)
        self._sequences_done(batch.model, batch.requests)
        error = error or Unavailable(f"model '{batch.model.name}' instance failed: {why}")
        for p in batch.requests:
            batch.model.stats.fail.add(0)
            batch.model.metrics.failure("BACKEND")
            self._reply(batch.model, p, Reply(p.request.request_id, error.status, error.wire_text()), [])

    def time_out_batch(self, batch: InFlight, running_ns: int) -> None:
        """A batch ran past its model's execution limit: its requests fail with DeadlineExceeded now, and a
        result that still comes from its worker is discarded (``on_result`` finds no such batch)."""
        state = batch.model
        self.pool.drop_batch(batch.batch_id)
        limit_ms = (state.execution_limit_ns or 0) // 1_000_000
        error = DeadlineExceeded(
            f"model '{state.name}' version {state.version}: the batch ran {running_ns / 1e6:.0f} ms, past "
            f"the model's execution limit (execution_timeout_ms {limit_ms}); the instance is being restarted"
        )
        self.fail_batch(batch, "execution limit", error)

    def fail_worker(self, worker: bytes, why: str) -> None:
        for batch in self.pool.take_batches(worker):
            self.fail_batch(batch, why)
        self.limiter.remove(worker)
        for state in self.b.registry.states():
            if state.sequencer is not None:  # its sequences are lost with the instance's state
                for p in state.sequencer.drop_instance(worker):
                    state.metrics.failure("BACKEND")
                    self.finish_early(state, p, Unavailable(f"model '{state.name}' instance failed: {why}"))

    def on_result(
        self, identity: bytes, state: ModelState, result: WorkerResult, frames: list[Frame]
    ) -> None:
        if result.partial:
            self._on_partial(identity, state, result, frames)
            return
        batch = self.pool.finish_batch(result.batch, identity)
        if batch is None:
            log.warning("event=stale_result worker=%s", identity)
            return
        self.limiter.release(identity)
        by_seq = {p.seq: p for p in batch.requests}
        timing = result.timings
        stats, metrics, window = state.stats, state.metrics, state.window
        stats.compute_input.add(timing[0])
        stats.compute_infer.add(timing[1])
        stats.compute_output.add(timing[2])
        now_ns = time.monotonic_ns()
        rows = sum(p.batch_size for p in batch.requests)
        state.batcher.observe_execution(rows, (now_ns - batch.sent_ns) / 1e9, now_ns / 1e9)
        state.batcher.observe_latencies((now_ns / 1e9 - p.arrival for p in batch.requests), now_ns / 1e9)
        t_in, t_inf, t_out = (x / 1000 for x in timing)
        sent_s = batch.sent_ns / 1e9
        out_frames: list[Frame]
        for res in result.results:
            p = by_seq.pop(res.id, None)
            if p is None:
                continue
            duration = now_ns - int(p.arrival * 1e9)
            rid = p.request.request_id
            if p.cancelled:
                metrics.cancelled()
                reply, out_frames = Reply(rid, Status.CANCELLED, "Cancelled: the request was cancelled"), []
            elif res.status == Status.OK:
                stats.record_success(duration)
                stats.inference_count += p.batch_size
                metrics.success(duration / 1000, (sent_s - p.arrival) * 1e6, p.batch_size, t_in, t_inf, t_out)
                window.record(now_ns / 1e9, duration / 1e9)
                wire = [protocol.tensor_to_wire(t) for t in res.outputs]
                if p.cache_key is not None and self.cache is not None:
                    self.caching.store(state, p.cache_key, wire, frames)
                outputs, out_frames = client_outputs(wire, frames)
                body = {"model": state.name, "version": state.version, "outputs": outputs}
                if state.signature.decoupled:
                    body["final"] = True  # the last, empty response of a stream
                reply = Reply(rid, Status.OK, body=body)
            else:
                stats.fail.add(duration)
                metrics.failure("BACKEND")
                reply, out_frames = Reply(rid, res.status, res.error), []
            self._reply(state, p, reply, out_frames)
        for p in by_seq.values():  # a worker that forgot a request must not leave its client hanging
            metrics.failure("OTHER")
            error = Unavailable("the worker returned no result for this request")
            self._reply(state, p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        stats.last_inference_ms = int(time.time() * 1000)
        self._sequences_done(state, batch.requests)
        self.pool.give_back(state, identity)

    def _on_partial(
        self, identity: bytes, state: ModelState, result: WorkerResult, frames: list[Frame]
    ) -> None:
        """One response of a decoupled model's stream: to the client at once; the request stays running."""
        batch = self.pool.batch(result.batch)
        if batch is None or batch.worker != identity:
            return
        by_seq = {p.seq: p for p in batch.requests}
        for res in result.results:
            p = by_seq.get(res.id)
            if p is None or p.cancelled:
                continue
            outputs, out_frames = client_outputs([protocol.tensor_to_wire(t) for t in res.outputs], frames)
            body = {"model": state.name, "version": state.version, "outputs": outputs, "final": False}
            self.outbox.send_client(p.client, Reply(p.request.request_id, Status.OK, body=body), out_frames)

    # ------------------------------------------------------------------------------------ replies

    def deliver(self, p: Pending, reply: Reply, frames: list[Frame]) -> None:
        """A final reply to its request's client, or to the ensemble run that sent the request."""
        if p.on_done is not None:
            p.on_done(reply, frames)
        else:
            self.outbox.send_client(p.client, reply, frames)

    def _reply(self, state: ModelState, p: Pending, reply: Reply, frames: list[Frame]) -> None:
        if state.order is None:
            self.deliver(p, reply, frames)
            return
        for _, (q, ready, ready_frames) in state.order.complete(p.seq, (p, reply, frames)):
            self.deliver(q, ready, ready_frames)

    def reply(self, state: ModelState, p: Pending, reply: Reply, frames: list[Frame]) -> None:
        """Answer ``p`` (in arrival order where ``state`` preserves it)."""
        self._reply(state, p, reply, frames)

    def finish_early(self, state: ModelState, p: Pending, error: ServerError) -> None:
        """Answer a request that never ran; it does not hold back the ordered responses behind it."""
        self.deliver(p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        if state.order is not None:
            for _, (q, ready, ready_frames) in state.order.drop(p.seq):
                self.deliver(q, ready, ready_frames)

    def fail_queued(self, error: ServerError) -> None:
        for state in self.b.registry.states():
            queued = state.batcher.remove(lambda _: True)
            if state.sequencer is not None:
                queued += state.sequencer.remove(lambda _: True)
            for p in queued:
                state.metrics.failure("OTHER")
                self.finish_early(state, p, error)
        for batch in self.pool.take_all_batches():
            self.limiter.release(batch.worker)
            for p in batch.requests:
                self.deliver(p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        self.ensembles.close()
        self.readers.close()  # only at shutdown: the broker maps no client region after this

    def poll_timeout_ms(self) -> float:
        """Milliseconds until the nearest batch deadline (models with an idle instance) or queue timeout."""
        deadline: float | None = None
        for state in self.b.registry.states():
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
        return sum(
            len(s.batcher) + (len(s.sequencer) if s.sequencer is not None else 0)
            for s in self.b.registry.states()
        )
