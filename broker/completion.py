"""Request completion: a batch's results, every reply, and the failures that fan out to many requests.

A worker's RESULT comes in two calls (``worker_inbox``): ``take_result`` takes the batch out of the pool
(``instance_pool.finish_batch``), gives its resources back and, where the model's scheduler is ``eager``,
the instance's place, so that dispatch can send the instance's next batch before this one's replies are
built; ``on_result`` then answers each request (its outputs renumbered for its client,
``messages.reply_outputs``; a cache miss stored first), records the batch's statistics, lets a sequence
send its next request and gives back the place of a model whose next batch waited for this one. A
decoupled model's partial responses go to the client at once (``on_partial``). ``reply`` keeps arrival
order where the model asks for it (``preserve_ordering``); ``deliver`` sends through the outbox, or to the
ensemble run that sent the request. A batch that will not finish (its worker died, could not be reached,
or ran past its execution limit) fails every request it holds (``fail_batch``, ``fail_worker``,
``time_out_batch``). Completion never calls dispatch or admission; they call it.
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
from .messages import reply_outputs
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
        tracer: Tracer,
    ) -> None:
        self.pool = pool
        self.outbox = outbox
        self.caching = caching
        self.limiter = limiter  # the instances' resources, given back when a batch ends
        self.states = states  # every model state that may still have work (``registry.states``)
        self.tracer = tracer  # the server's per-request traces; off by default

    def take_result(self, identity: bytes, state: ModelState, result: WorkerResult) -> InFlight | None:
        """The batch a final RESULT from ``identity`` ends, out of the pool (None: stale), its resources
        given back, and the instance's place where the model's next batch need not wait for this one's
        replies (``Scheduler.eager``): the caller may dispatch it before calling ``on_result``."""
        batch = self.pool.finish_batch(result.batch, identity)
        if batch is None:
            log.warning("event=stale_result worker=%s", identity)
            return None
        self.limiter.release(identity)
        if state.scheduler.eager:
            self.pool.give_back(state, identity)
        return batch

    def on_result(
        self, identity: bytes, state: ModelState, batch: InFlight, result: WorkerResult, frames: list[Frame]
    ) -> None:
        """Answer every request of ``batch`` (from ``take_result``) from its worker's RESULT."""
        by_seq = {p.seq: p for p in batch.requests}
        now_ns = time.monotonic_ns()
        ok: list[Pending] = []  # answered with their outputs, counted below
        failed: list[Pending] = []  # failed in the model
        cancelled = 0
        out_frames: list[Frame]
        if self.tracer.on:  # traced requests' compute times (and outputs) before their replies leave
            self.tracer.batch_ran(batch, result, frames, now_ns)
        for res in result.results:  # every reply leaves first; the figures are recorded after
            p = by_seq.pop(res.id, None)
            if p is None:
                continue
            rid = p.request.request_id
            cancelled += p.cancelled  # a decoupled one's last response is the model's (it decides, as Triton)
            if p.cancelled and not state.signature.decoupled:
                reply, out_frames = Reply(rid, Status.CANCELLED, "Cancelled: the request was cancelled"), []
            elif res.status == Status.OK:
                if not p.cancelled:
                    ok.append(p)
                if p.on_outputs is not None and state.order is None and p.cache_key is None:
                    p.on_outputs(res, frames)  # an ensemble step: its outputs go on as the worker sent them
                    continue
                if p.cache_key is not None and self.caching.cache is not None:
                    # copied before the reply: once answered, the client may reuse its output slots
                    self.caching.store(state, p.cache_key, [protocol.tensor_to_wire(t) for t in res.outputs],
                                       frames)  # fmt: skip
                outputs, out_frames = reply_outputs(res.outputs, frames)
                body = {"model": state.name, "version": state.version, "outputs": outputs}
                if res.parameters:
                    body["parameters"] = dict(res.parameters)
                if state.signature.decoupled:
                    body["final"] = True  # the last, empty response of a stream
                reply = Reply(rid, Status.OK, body=body)
            else:
                if not p.cancelled:
                    failed.append(p)
                reply, out_frames = Reply(rid, res.status, res.error), []
            self.reply(state, p, reply, out_frames)
        forgotten = list(by_seq.values())
        for p in forgotten:  # a worker that forgot a request must not leave its client hanging
            error = Unavailable("the worker returned no result for this request")
            self.reply(state, p, Reply(p.request.request_id, error.status, error.wire_text()), [])
        self._sequences_done(state, batch.requests)
        if not state.scheduler.eager:  # a sequence's next request waited for this one's end
            self.pool.give_back(state, identity)
        self._account(state, batch, result, now_ns, ok, failed, cancelled, len(forgotten))
        if self.tracer.on:
            self.tracer.batch_done(batch)

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
        now_s = now_ns / 1e9
        compute_ns = timing[0] + timing[1] + timing[2]
        state.scheduler.observe(batch.requests, (now_ns - batch.sent_ns) / 1e9, now_s, compute_ns, n)
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

    def on_partial(
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
            outputs, out_frames = reply_outputs(res.outputs, frames)
            body = {"model": state.name, "version": state.version, "outputs": outputs, "final": False}
            if res.parameters:
                body["parameters"] = dict(res.parameters)
            self.outbox.send_client(p.client, Reply(p.request.request_id, Status.OK, body=body), out_frames)

    def _finish_streamed(
        self, state: ModelState, p: Pending, res: RequestResult, frames: list[Frame]
    ) -> None:
        """The last response of one request of a decoupled batch that still runs (Triton-style senders
        finish their requests one by one): answered, then counted. A cancelled request's last response is
        the model's too (it may have finished its work anyway), counted as cancelled."""
        now_ns = time.monotonic_ns()
        duration = now_ns - int(p.arrival * 1e9)
        rid = p.request.request_id
        out_frames: list[Frame]
        if res.status == Status.OK:
            outputs, out_frames = reply_outputs(res.outputs, frames)
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
        t = p.trace
        end_ns = 0
        if t is not None:  # a traced request's outcome (and outputs) before the reply leaves
            reply = self.tracer.replying(t, reply, frames)
            end_ns = time.monotonic_ns()  # REQUEST_END as it leaves: a door may be done before we go on
        if p.on_done is not None:
            p.on_done(reply, frames)
        else:
            self.outbox.send_client(p.client, reply, frames)
        if t is not None:
            self.tracer.finish(t, end_ns)

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
            for p in state.scheduler.drop_instance(worker):  # sequences are lost with the instance's state
                state.metrics.failure("BACKEND")
                self.finish_early(state, p, Unavailable(f"model '{state.name}' instance failed: {why}"))

    def fail_running(self, error: ServerError) -> None:
        """Answer every request of every batch in flight with ``error`` (the server is stopping)."""
        for batch in self.pool.take_all_batches():
            self.limiter.release(batch.worker)
            for p in batch.requests:
                self.deliver(p, Reply(p.request.request_id, error.status, error.wire_text()), [])

    def _sequences_done(self, state: ModelState, requests: list[Pending]) -> None:
        """The requests of a batch finished: their sequences may send the next one (or close). Only a
        scheduler that is not ``eager`` waits for a batch's end."""
        if not state.scheduler.eager:
            state.scheduler.done(requests, time.monotonic())
