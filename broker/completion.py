"""Request completion: a batch's results, every reply, and the failures that fan out to many requests.

``on_result`` takes a worker's RESULT for an in-flight batch (``instance_pool.finish_batch``): each request
is answered (its outputs renumbered for its client, ``messages.client_outputs``; a cache miss stored first),
the batch's statistics recorded, the instance's place given back and a sequence allowed its next request; a
decoupled model's partial responses go to the client at once. ``reply`` keeps arrival order where the model
asks for it (``preserve_ordering``); ``deliver`` sends through the outbox, or to the ensemble run that sent
the request. A batch that will not finish (its worker died, could not be reached, or ran past its
execution limit) fails every request it holds (``fail_batch``, ``fail_worker``, ``time_out_batch``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from zinfer.client import protocol
from zinfer.client.errors import DeadlineExceeded, ServerError, Status, Unavailable
from zinfer.client.protocol import Frame, Reply
from zinfer.client.worker_protocol import RequestResult, WorkerResult

from .batching.rate_limiter import RateLimiter
from .cache_path import CachePath
from .instance_pool import InstancePool
from .messages import client_outputs
from .model_state import InFlight, ModelState, Pending
from .outbox import Outbox
from .tracing import Tracer

log = logging.getLogger(__name__)


class Completion:
    def __init__(
        self,
        pool: InstancePool,
        outbox: Outbox,
        caching: CachePath,
        limiter: RateLimiter[bytes, tuple[str, int, int]],
        states: Callable[[], Iterable[ModelState]],
    ) -> None:
        self.pool = pool
        self.outbox = outbox
        self.caching = caching
        self.limiter = limiter  # the instances' resources, given back when a batch ends
        self.states = states  # every model state that may still have work (``registry.states``)
        # called with a model whose instance just became free (``Dispatcher.dispatch_freed``)
        self.on_free: Callable[[ModelState], None] | None = None
        self.tracer = Tracer()  # the server's (shared with admission); off by default

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
        on_free = self.on_free if state.sequencer is None else None  # a sequence's next waits for this
        if on_free is not None:  # the instance's next batch leaves before this one's replies are built
            self.pool.give_back(state, identity)
            on_free(state)
        by_seq = {p.seq: p for p in batch.requests}
        now_ns = time.monotonic_ns()
        ok: list[Pending] = []  # answered with their outputs, counted below
        failed: list[Pending] = []  # failed in the model
        cancelled = 0
        out_frames: list[Frame]
        for res in result.results:  # every reply leaves first; the figures are recorded after
            p = by_seq.pop(res.id, None)
            if p is None:
                continue
            rid = p.request.request_id
            if p.cancelled:
                cancelled += 1
                reply, out_frames = Reply(rid, Status.CANCELLED, "Cancelled: the request was cancelled"), []
            elif res.status == Status.OK:
                ok.append(p)
                if p.on_outputs is not None and state.order is None and p.cache_key is None:
                    p.on_outputs(res, frames)  # an ensemble step: its outputs go on as the worker sent them
                    continue
                wire = [protocol.tensor_to_wire(t) for t in res.outputs]
                if p.cache_key is not None and self.caching.cache is not None:
                    # copied before the reply: once answered, the client may reuse its output slots
                    self.caching.store(state, p.cache_key, wire, frames)
                outputs, out_frames = client_outputs(wire, frames)
                body = {"model": state.name, "version": state.version, "outputs": outputs}
                if res.parameters:
                    body["parameters"] = dict(res.parameters)
                if state.signature.decoupled:
                    body["final"] = True  # the last, empty response of a stream
                reply = Reply(rid, Status.OK, body=body)
            else:
                failed.append(p)
                reply, out_frames = Reply(rid, res.status, res.error), []
            self.reply(state, p, reply, out_frames)
        forgotten = list(by_seq.values())
        for p in forgotten:  # a worker that forgot a request must not leave its client hanging
            error = Unavailable("the worker returned no result for this request")
            self.reply(state, p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        self._sequences_done(state, batch.requests)
        if on_free is None:
            self.pool.give_back(state, identity)
        self._account(state, batch, result, now_ns, ok, failed, cancelled, len(forgotten))
        if self.tracer.on:
            self.tracer.batch_done(batch, result.timings, now_ns)

    @staticmethod
    def _account(
        state: ModelState,
        batch: InFlight,
        result: WorkerResult,
        now_ns: int,
        ok: list[Pending],
        failed: list[Pending],
        cancelled: int,
        forgotten: int,
    ) -> None:
        """The figures of a batch whose replies have left: compute times, each request's latency and
        outcome, the adaptive batcher's observations. Durations run to ``now_ns``, when the result came."""
        stats, metrics, window = state.stats, state.metrics, state.window
        timing = result.timings
        n = batch.executions  # a run: its requests' executions, timed together
        stats.compute_input.add(timing[0], n)
        stats.compute_infer.add(timing[1], n)
        stats.compute_output.add(timing[2], n)
        if state.runs:
            state.cost.observe(timing[0] + timing[1] + timing[2], n)
        now_s = now_ns / 1e9
        rows = sum(p.batch_size for p in batch.requests)
        state.batcher.observe_execution(rows, (now_ns - batch.sent_ns) / 1e9, now_s)
        state.batcher.observe_latencies((now_s - p.arrival for p in batch.requests), now_s)
        t_in, t_inf, t_out = (x / (1000 * n) for x in timing)
        sent_s = batch.sent_ns / 1e9
        for p in ok:
            duration = now_ns - int(p.arrival * 1e9)
            stats.record_success(duration)
            stats.inference_count += p.batch_size
            metrics.success(duration / 1000, (sent_s - p.arrival) * 1e6, p.batch_size, t_in, t_inf, t_out)
            window.record(now_s, duration / 1e9)
        for p in failed:
            stats.fail.add(now_ns - int(p.arrival * 1e9))
            metrics.failure("BACKEND")
        for _ in range(cancelled):
            metrics.cancelled()
        for _ in range(forgotten):
            metrics.failure("OTHER")
        stats.last_inference_ms = int(time.time() * 1000)

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
            if p is None:
                continue
            if res.final:  # this request's stream ends here; the batch runs on for the others
                batch.requests.remove(p)
                self._finish_streamed(state, p, res, frames)
                continue
            if p.cancelled:
                continue
            outputs, out_frames = client_outputs([protocol.tensor_to_wire(t) for t in res.outputs], frames)
            body = {"model": state.name, "version": state.version, "outputs": outputs, "final": False}
            if res.parameters:
                body["parameters"] = dict(res.parameters)
            self.outbox.send_client(p.client, Reply(p.request.request_id, Status.OK, body=body), out_frames)

    def _finish_streamed(
        self, state: ModelState, p: Pending, res: RequestResult, frames: list[Frame]
    ) -> None:
        """The last response of one request of a decoupled batch that still runs (Triton-style senders
        finish their requests one by one): answered, then counted."""
        now_ns = time.monotonic_ns()
        duration = now_ns - int(p.arrival * 1e9)
        rid = p.request.request_id
        out_frames: list[Frame]
        if p.cancelled:
            reply, out_frames = Reply(rid, Status.CANCELLED, "Cancelled: the request was cancelled"), []
        elif res.status == Status.OK:
            outputs, out_frames = client_outputs([protocol.tensor_to_wire(t) for t in res.outputs], frames)
            body = {"model": state.name, "version": state.version, "outputs": outputs, "final": True}
            if res.parameters:
                body["parameters"] = dict(res.parameters)
            reply = Reply(rid, Status.OK, body=body)
        else:
            reply, out_frames = Reply(rid, res.status, res.error), []
        self._sequences_done(state, [p])
        self.reply(state, p, reply, out_frames)
        if p.cancelled:
            state.metrics.cancelled()
        elif res.status == Status.OK:
            state.stats.record_success(duration)
            state.stats.inference_count += p.batch_size
            state.metrics.success(duration / 1000, 0.0, p.batch_size)
            state.window.record(now_ns / 1e9, duration / 1e9)
        else:
            state.stats.fail.add(duration)
            state.metrics.failure("BACKEND")

    def deliver(self, p: Pending, reply: Reply, frames: list[Frame]) -> None:
        """A final reply to its request's client, or to the ensemble run that sent the request."""
        if p.on_done is not None:
            p.on_done(reply, frames)
        else:
            self.outbox.send_client(p.client, reply, frames)

    def reply(self, state: ModelState, p: Pending, reply: Reply, frames: list[Frame]) -> None:
        """Answer ``p`` (in arrival order where ``state`` preserves it)."""
        if state.order is None:
            self.deliver(p, reply, frames)
            return
        for _, (q, ready, ready_frames) in state.order.complete(p.seq, (p, reply, frames)):
            self.deliver(q, ready, ready_frames)

    def finish_early(self, state: ModelState, p: Pending, error: ServerError) -> None:
        """Answer a request that never ran; it does not hold back the ordered responses behind it."""
        state.metrics.pending(state.queued)  # it left the queue (cancelled, timed out, failed): say so now
        self.deliver(p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        if state.order is not None:
            for _, (q, ready, ready_frames) in state.order.drop(p.seq):
                self.deliver(q, ready, ready_frames)

    def fail_batch(self, batch: InFlight, why: str, error: ServerError | None = None) -> None:
        """Answer every request of a batch that will not finish with ``error`` (default: Unavailable)."""
        self.limiter.release(batch.worker)
        self._sequences_done(batch.model, batch.requests)
        error = error or Unavailable(f"model '{batch.model.name}' instance failed: {why}")
        for p in batch.requests:
            batch.model.stats.fail.add(0)
            batch.model.metrics.failure("BACKEND")
            self.reply(batch.model, p, Reply(p.request.request_id, error.status, error.wire_text()), [])

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
        for state in self.states():
            if state.sequencer is not None:  # its sequences are lost with the instance's state
                for p in state.sequencer.drop_instance(worker):
                    state.metrics.failure("BACKEND")
                    self.finish_early(state, p, Unavailable(f"model '{state.name}' instance failed: {why}"))

    def fail_running(self, error: ServerError) -> None:
        """Answer every request of every batch in flight with ``error`` (the server is stopping)."""
        for batch in self.pool.take_all_batches():
            self.limiter.release(batch.worker)
            for p in batch.requests:
                self.deliver(p, Reply(p.request.request_id, error.status, error.wire_text()), [])

    def _sequences_done(self, state: ModelState, requests: list[Pending]) -> None:
        """The requests of a batch finished: their sequences may send the next one (or close)."""
        if state.sequencer is not None:
            ids = [p.sequence.id for p in requests if p.sequence is not None]
            state.sequencer.done(ids, time.monotonic())
