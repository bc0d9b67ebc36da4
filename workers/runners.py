"""How one EXECUTE runs, one runner per kind of model, chosen once when the model is loaded
(:func:`runner_for`), and the guard that answers every EXECUTE (:class:`Reply`).

=====================  ======================================================================================
runner                 model
=====================  ======================================================================================
``DenseRunner``        whole-batch models (built-in kernels, native Python, ONNX): ``batch.run_batch`` /
                       ``run_serial``, inputs gathered into batch arrays (on the device)
``RequestRunner``      request-by-request models (a Triton-style model.py that is not decoupled):
                       ``request_batch.run_requests``
``StreamRunner``       decoupled native models: ``stream.run_stream``
``TritonStreamRunner`` decoupled Triton-style models: ``triton_stream.run_triton_stream``
``SideStreamRunner``   decoupled Triton-style models with ``async def execute``: the batch starts and runs on
                       beside the next ones (``side_work``), answered when its requests end
``SideRequestRunner``  Triton-style models with ``async def execute`` that are not decoupled: the batch's
                       coroutine starts and runs on beside the next ones (``async_requests``), answered by
                       one RESULT when it returned; a run (``serial``) goes one request after another as
                       ``RequestRunner`` runs it
=====================  ======================================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol

from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import Frame
from zinfer.client.worker_protocol import RequestResult, WorkerResult
from zinfer.modelconfig.signature import Signature

from .async_requests import start_async_requests
from .batch import run_batch, run_serial
from .batch_io import BatchOutcome, BatchRequest, error_result
from .cancel_flags import CancelFlags
from .device import CPU, Device
from .model import AnyModel, Model, RequestModel
from .regions import RegionCache
from .request_batch import run_requests
from .runtime import WorkerRuntime
from .sequence_state import ImplicitStates
from .side_work import SideWork
from .stream import SendPartial, run_stream
from .triton_model import TritonModel, executes_async
from .triton_stream import run_triton_stream, runs_concurrently, start_triton_stream

__all__ = ["Reply", "Runner", "runner_for"]

log = logging.getLogger(__name__)

SendResult = Callable[[WorkerResult, list[Frame]], None]


class Runner(Protocol):
    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        """The outcome of one EXECUTE, or None when the batch runs on (and is answered later)."""
        ...


_UNSET = BatchOutcome()
"""A :class:`Reply`'s outcome until its runner returns one (never sent: ``__exit__`` puts a new one in)."""


class Reply:
    """The guard around one EXECUTE: on every way out of its ``with`` block exactly one RESULT goes to the
    broker (unless the runner handed the batch on, ``outcome`` None): the runner's outcome, or, when the
    runner raised, an error for every request it had not answered (the runner's own ServerError, any other
    exception as an InternalError). Sends a decoupled model's partial results too (:meth:`partial`)."""

    __slots__ = ("batch", "outcome", "requests", "send_result")

    def __init__(self, batch: int, requests: Sequence[BatchRequest], send_result: SendResult) -> None:
        self.batch = batch
        self.requests = requests
        self.send_result = send_result
        # the runner's outcome (None: the batch runs on); an empty one until the runner returns, made only
        # where the runner raised (``__exit__``)
        self.outcome: BatchOutcome | None = _UNSET

    def partial(self, result: RequestResult, frames: list[Frame]) -> None:
        self.send_result(WorkerResult(self.batch, (result,), partial=True), frames)

    def __enter__(self) -> Reply:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        out = self.outcome
        if out is _UNSET:  # the runner raised before it answered
            out = self.outcome = BatchOutcome()
        if exc is not None:
            log.error("event=batch_failed batch=%d error=%r", self.batch, exc, exc_info=exc)
            out = out if out is not None else BatchOutcome()
            answered = {r.id for r in out.results}
            failure = (
                exc
                if isinstance(exc, ServerError)
                else InternalError(f"the worker failed running the batch: {type(exc).__name__}: {exc}")
            )
            out.results.extend(error_result(r.id, failure) for r in self.requests if r.id not in answered)
        if out is not None:
            timings = (out.input_ns, out.infer_ns, out.output_ns)
            self.send_result(WorkerResult(self.batch, tuple(out.results), timings=timings), out.frames)
        # answered. A model's SystemExit (sys.exit in execute) is a failed batch, as under Triton's stub, and
        # the worker serves on; KeyboardInterrupt and the like still end it
        return isinstance(exc, (Exception, SystemExit))


class DenseRunner:
    __slots__ = ("cancels", "device", "model", "regions", "sig", "states")

    def __init__(
        self,
        model: Model,
        sig: Signature,
        regions: RegionCache,
        device: Device,
        states: ImplicitStates | None,
        cancels: CancelFlags,
    ) -> None:
        self.model, self.sig, self.regions, self.device, self.states = model, sig, regions, device, states
        self.cancels = cancels

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        if serial:  # a run: each request executed alone, answered together
            return run_serial(self.model, self.sig, requests, frames, self.regions, self.device, self.states,
                              self.cancels)  # fmt: skip
        return run_batch(self.model, self.sig, requests, frames, self.regions, self.device, self.states)


class RequestRunner:
    __slots__ = ("cancels", "device", "model", "regions", "sig", "states")

    def __init__(
        self,
        model: RequestModel,
        sig: Signature,
        regions: RegionCache,
        device: Device,
        states: ImplicitStates | None,
        cancels: CancelFlags,
    ) -> None:
        self.model, self.sig, self.regions, self.device, self.states = model, sig, regions, device, states
        self.cancels = cancels

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        return run_requests(self.model, self.sig, requests, frames, self.regions, self.device, self.states,
                            serial, self.cancels)  # fmt: skip


class SideRequestRunner(RequestRunner):
    __slots__ = ("side", "triton")

    def __init__(
        self,
        model: TritonModel,
        sig: Signature,
        regions: RegionCache,
        device: Device,
        states: ImplicitStates | None,
        cancels: CancelFlags,
        side: SideWork,
    ) -> None:
        super().__init__(model, sig, regions, device, states, cancels)
        self.triton, self.side = model, side

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        if serial:  # a run's requests are executions one after another, answered together
            return super().run(batch, serial, requests, frames, reply)
        run = start_async_requests(self.triton, self.sig, requests, frames, self.regions, self.device,
                                   self.states, self.cancels)  # fmt: skip
        if not run.step():  # runs on beside the next batches: answered when its coroutine returned
            self.side.keep(batch, run)
            return None
        return run.finish()


class StreamRunner:
    __slots__ = ("model", "regions", "sig")

    def __init__(self, model: AnyModel, sig: Signature, regions: RegionCache) -> None:
        self.model, self.sig, self.regions = model, sig, regions

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        return run_stream(self.model, self.sig, requests, frames, self.regions, reply.partial)


class TritonStreamRunner:
    __slots__ = ("model", "regions", "runtime", "sig")

    def __init__(
        self, model: TritonModel, sig: Signature, regions: RegionCache, runtime: WorkerRuntime
    ) -> None:
        self.model, self.sig, self.regions, self.runtime = model, sig, regions, runtime

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        send: SendPartial = reply.partial
        return run_triton_stream(self.model, self.sig, requests, frames, self.regions, send, self.runtime)


class SideStreamRunner(TritonStreamRunner):
    __slots__ = ("side",)

    def __init__(
        self, model: TritonModel, sig: Signature, regions: RegionCache, runtime: WorkerRuntime, side: SideWork
    ) -> None:
        super().__init__(model, sig, regions, runtime)
        self.side = side

    def run(
        self,
        batch: int,
        serial: bool,
        requests: Sequence[BatchRequest],
        frames: Sequence[Frame],
        reply: Reply,
    ) -> BatchOutcome | None:
        run = start_triton_stream(
            self.model, self.sig, requests, frames, self.regions, reply.partial, self.runtime
        )
        if not run.step():  # runs on beside the next batches: answered when its requests end
            self.side.keep(batch, run)
            return None
        return run.finish()


def runner_for(
    model: AnyModel,
    sig: Signature,
    regions: RegionCache,
    device: Device,
    states: ImplicitStates | None,
    runtime: WorkerRuntime,
    side: SideWork,
) -> Runner:
    """The runner of a loaded model (its kind does not change while it serves)."""
    if sig.decoupled:
        if runs_concurrently(model):
            return SideStreamRunner(model, sig, regions, runtime, side)
        if isinstance(model, TritonModel):
            return TritonStreamRunner(model, sig, regions, runtime)
        return StreamRunner(model, sig, regions)
    if executes_async(model):
        return SideRequestRunner(model, sig, regions, device, states, runtime.cancels, side)
    if isinstance(model, RequestModel):
        return RequestRunner(model, sig, regions, device, states, runtime.cancels)
    return DenseRunner(model, sig, regions, device, states, runtime.cancels)


def run_once(
    model: AnyModel,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device = CPU,
    states: ImplicitStates | None = None,
    *,
    serial: bool = False,
    runtime: WorkerRuntime | None = None,
) -> BatchOutcome:
    """One EXECUTE of ``model`` outside a worker (a test, a tool), by the runner of its kind; a decoupled
    model's partial results are dropped."""
    runtime = runtime if runtime is not None else WorkerRuntime()
    runner = runner_for(model, sig, regions, device, states, runtime, SideWork(runtime))
    out = runner.run(0, serial, requests, frames, Reply(0, requests, _drop))
    return out if out is not None else BatchOutcome()


def _drop(result: WorkerResult, frames: list[Frame]) -> None:
    pass
