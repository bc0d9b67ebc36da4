"""A batch of a Triton-style model with an ``async def execute`` that is not decoupled, run beside the next.

Triton runs such a model's batches concurrently: each batch's coroutine on the instance's event loop while
the next batch starts. Here the batch's requests are opened as any request-by-request batch
(``request_batch.open_inputs``), its coroutine is started on the worker's loop
(``TritonModel.start_async``) and the worker goes on; ``side_work`` steps the run while the worker serves
other batches, and once the coroutine has returned (and any response sender the model took has sent its
final flag) the batch is answered by one RESULT as a batch run in place would be: one result per request,
a model's exception failing that batch alone. The outputs are written under the batch's own region table,
taken when it started (the worker's table is the newest batch's by then).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import Frame
from zinfer.modelconfig.signature import Signature

from .batch_io import BatchOutcome, BatchRequest, Opened, error_result, model_failure
from .cancel_flags import CancelFlags
from .device import Device
from .regions import RegionCache
from .request_batch import answer_all, open_inputs
from .sequence_state import ImplicitStates
from .triton_model import AsyncCall, TritonModel

log = logging.getLogger(__name__)


class AsyncRequestRun:
    """One such batch in flight: :meth:`step` says whether its call is over; :meth:`finish` is its
    outcome (every request answered)."""

    def __init__(
        self,
        sig: Signature,
        regions: RegionCache,
        device: Device,
        states: ImplicitStates | None,
        runnable: Sequence[Opened],
        out: BatchOutcome,
        t0: int,
    ) -> None:
        self.sig, self.regions, self.device, self.states = sig, regions, device, states
        self.runnable, self.out, self.t0 = runnable, out, t0
        self.table: Mapping[str, tuple[int, int, int]] = regions.table  # the batch's own
        self.t1 = time.perf_counter_ns()
        self.call: AsyncCall | None = None

    def step(self) -> bool:
        return self.call is None or self.call.step()

    def finish(self) -> BatchOutcome:
        out, call = self.out, self.call
        if call is None:  # no request could be read: each is answered already
            return out
        t2 = time.perf_counter_ns()
        if call.results is None:
            error = call.error if call.error is not None else InternalError("the batch did not end")
            if not isinstance(error, ServerError):
                log.warning("event=model_failed model=%s error=%r", self.sig.name, error, exc_info=error)
                error = model_failure(error, self.sig.name)
            out.results.extend(error_result(one.req.id, error) for one in self.runnable)
        else:
            previous = self.regions.table
            self.regions.use_table(self.table)
            try:
                answer_all(self.sig, self.runnable, call.results, self.regions, self.device, self.states, out)
            except Exception as exc:  # still one answer for each request: none is left without one
                log.error("event=batch_failed model=%s error=%r", self.sig.name, exc, exc_info=exc)
                answered = {r.id for r in out.results}
                failure = InternalError(f"could not write the outputs: {type(exc).__name__}: {exc}")
                out.results.extend(
                    error_result(o.req.id, failure) for o in self.runnable if o.req.id not in answered
                )
            finally:
                self.regions.use_table(previous)
        t3 = time.perf_counter_ns()
        out.input_ns, out.infer_ns, out.output_ns = self.t1 - self.t0, t2 - self.t1, t3 - t2
        return out


def start_async_requests(
    model: TritonModel,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device,
    states: ImplicitStates | None,
    cancels: CancelFlags,
) -> AsyncRequestRun:
    """Open the batch's requests and start its coroutine; the caller steps the run until it is over."""
    out = BatchOutcome()
    t0 = time.perf_counter_ns()
    runnable, inputs = open_inputs(sig, requests, frames, regions, states, cancels, out)
    run = AsyncRequestRun(sig, regions, device, states, runnable, out, t0)
    if runnable:
        run.call = model.start_async(inputs)
    return run
