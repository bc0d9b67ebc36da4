"""A decoupled Triton-style model: responses through ``request.get_response_sender()``, from any thread.

``execute`` gets the batch's requests and returns None; each request's sender sends any number of responses,
the last with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (or that flag alone), from ``execute`` or from threads
that run on after it returned. Senders only queue what they send and set the runtime's ``threads.wake``; the
worker's main thread, pumping its socket meanwhile, takes each response off the queue and sends it to the
broker at once, as a partial RESULT: ``final`` false, or true for the request's last, which ends that
request's stream (its client gets it as the final response). The batch ends, and the instance takes its next
one, when ``execute`` has returned and every request has ended.

A request whose stream cannot end normally ends with an error instead, never a hang: ``execute`` raised,
or returned something other than None, or the request's sender was released (garbage) without the final
flag. A worker that dies, or a batch past the model's execution limit, fails its open requests in the
broker as any other batch. An error response ends the client's stream with that error (zinfer's streams
end at an error); what that request's sender sends later is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import Frame
from zinfer.client.worker_protocol import RequestResult
from zinfer.modelconfig.signature import Signature

from . import triton_python_backend_utils as pb
from .batch_io import (
    BatchOutcome,
    BatchRequest,
    check_output,
    emit,
    error_result,
    model_failure,
    open_requests,
    output_wire,
)
from .model import RequestInputs
from .model_loop import Wake
from .pb_errors import server_error
from .regions import RegionCache
from .runtime import WorkerRuntime
from .triton_model import TritonModel, call_with, executes_async, pb_request

log = logging.getLogger(__name__)

SendPartial = Callable[[RequestResult, list[Frame]], None]
_RELEASED = object()


class _Queue:
    """What the senders of one batch sent, in order: ``(request id, response | None | _RELEASED, final)``."""

    def __init__(self, wake: Wake) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._items: deque[tuple[int, Any, bool]] = deque()

    def put(self, rid: int, response: Any, final: bool) -> None:
        with self._lock:
            self._items.append((rid, response, final))
        self._wake.set()

    def take(self) -> list[tuple[int, Any, bool]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


def _attach_sender(request: pb.InferenceRequest, rid: int, queue: _Queue, decoupled: bool) -> None:
    def deliver(response: pb.InferenceResponse | None, final: bool) -> None:
        queue.put(rid, response, final)

    sender = pb.InferenceResponseSender(deliver, request._cancelled, decoupled)
    request._sender = sender
    # released without the final flag (and nothing else will end it): the request ends with an error
    weakref.finalize(sender, queue.put, rid, _RELEASED, True)


class _Streams:
    """The open requests of the batch and how each response becomes a partial RESULT."""

    def __init__(self, sig: Signature, regions: RegionCache, send: SendPartial, name: str) -> None:
        self.sig, self.regions, self.send, self.name = sig, regions, send, name
        self.open: dict[int, tuple[BatchRequest, int]] = {}  # id -> (request, rows)

    def end(self, rid: int, error: ServerError) -> None:
        if self.open.pop(rid, None) is not None:
            self.send(error_result(rid, error)._replace(final=True), [])

    def end_all(self, error: ServerError) -> None:
        for rid in list(self.open):
            self.end(rid, error)

    def response(self, rid: int, response: Any, final: bool) -> None:
        entry = self.open.get(rid)
        if entry is None:
            if response is not _RELEASED:
                log.debug("event=response_dropped model=%s request=%d", self.name, rid)
            return
        req, rows = entry
        if response is _RELEASED:
            why = "the request's response sender was released without sending the final flag"
            self.end(rid, InternalError(f"{why} (TRITONSERVER_RESPONSE_COMPLETE_FINAL)"))
            return
        if response is not None and response.has_error():
            self.end(rid, server_error(response.error()))
            return
        frames: list[Frame] = []
        tensors = []
        if response is not None:
            try:
                by_name = {t.name(): t.as_numpy() for t in response.output_tensors()}
                for want in req.outputs:
                    if want.name in by_name:
                        arr = check_output(want.name, by_name[want.name], self.sig, rows, per_request=True)
                        tensors.append(emit(want.name, arr, None, output_wire(want.name, arr, self.sig),
                                            self.regions, frames))  # fmt: skip
            except ServerError as exc:
                self.end(rid, exc)
                return
        if final:
            del self.open[rid]
        parameters = response._parameters if response is not None else {}
        self.send(RequestResult(rid, outputs=tuple(tensors), final=final, parameters=parameters), frames)


def run_triton_stream(
    model: TritonModel,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    send_partial: SendPartial,
    runtime: WorkerRuntime,
) -> BatchOutcome:
    """Run one batch of a decoupled Triton-style model; every request ends through ``send_partial``."""
    run = start_triton_stream(model, sig, requests, frames, regions, send_partial, runtime)
    if not runtime.threads.pump(run.step):
        run.streams.end_all(InternalError("the worker is stopping"))
    return run.finish()


def runs_concurrently(model: Any) -> TypeGuard[TritonModel]:
    """Whether the batches of ``model`` run side by side as a decoupled model's: its ``async def execute``
    (``triton_model.executes_async``) with decoupled responses."""
    return executes_async(model) and model.decoupled


class StreamRun:
    """One batch of a decoupled Triton-style model in flight: :meth:`step` sends what its senders queued
    and says whether every request has ended; :meth:`finish` is its outcome."""

    def __init__(self, sig: Signature, streams: _Streams, queue: _Queue, out: BatchOutcome, t0: int) -> None:
        self.sig = sig
        self.instance_name = sig.name
        self.streams = streams
        self.queue = queue
        self.out = out
        self.t0 = t0
        self.future: Any = None
        self.returned = False
        self.released: list[int] = []  # senders gone while execute ran: judged once it is known how it ended

    def step(self) -> bool:
        if self.future is None:
            return True
        streams, sig = self.streams, self.sig
        for rid, response, final in self.queue.take():
            if response is _RELEASED and not self.returned:
                self.released.append(rid)
            else:
                streams.response(rid, response, final)
        if self.future.done() and not self.returned:
            self.returned = True
            for rid, response, final in self.queue.take():  # sent before execute returned
                if response is _RELEASED:
                    self.released.append(rid)
                else:
                    streams.response(rid, response, final)
            exc = self.future.exception()
            if exc is not None:
                log.warning("event=model_failed model=%s error=%r", sig.name, exc, exc_info=exc)
                streams.end_all(exc if isinstance(exc, ServerError) else model_failure(exc, sig.name))
            elif self.future.result() is not None:
                streams.end_all(InternalError(  # Triton's text, clients match on it
                    f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                    "function must return None."
                ))  # fmt: skip
            for rid in self.released:
                streams.response(rid, _RELEASED, True)
        return self.returned and not streams.open

    def finish(self) -> BatchOutcome:
        self.out.infer_ns = time.perf_counter_ns() - self.t0
        return self.out


def start_triton_stream(
    model: TritonModel,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    send_partial: SendPartial,
    runtime: WorkerRuntime,
) -> StreamRun:
    """Start one batch of a decoupled Triton-style model: its ``execute`` runs on the model thread or the
    event loop; the caller steps the returned run until it says every request has ended."""
    out = BatchOutcome()
    streams = _Streams(sig, regions, send_partial, sig.name)
    queue = _Queue(runtime.threads.wake)
    pb_requests: list[pb.InferenceRequest] = []
    run = StreamRun(sig, streams, queue, out, time.perf_counter_ns())
    run.instance_name = model.instance_name
    for req, arrays, rows in open_requests(requests, frames, regions, sig.batching, out):
        names = tuple(o.name for o in req.outputs)
        inputs = RequestInputs(req.request_id, arrays, names, req.sequence, req.parameters,
                               runtime.cancels.flag(req.id))  # fmt: skip
        request = pb_request(inputs, model.name)
        _attach_sender(request, req.id, queue, decoupled=True)
        pb_requests.append(request)
        streams.open[req.id] = (req, rows)
    if not pb_requests:
        return run
    if runs_concurrently(model):  # the coroutine is made here and runs on the loop, not on the model thread
        run.future = runtime.threads.get().start_coroutine(call_with(model.instance.execute, pb_requests))
    else:
        run.future = runtime.threads.get().submit(call_with, model.instance.execute, pb_requests)
    del pb_requests, request  # the model alone holds the requests (and their senders) now
    return run
