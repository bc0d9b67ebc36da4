"""One EXECUTE for a model that answers request by request (a Triton-style model.py).

Each request gets its own host arrays over its own bytes (nothing is concatenated), plus, for a request of a
sequence, its own control inputs (START, END, READY, CORRID as the config names them, one row each); the
model returns one result per request. A request whose inputs cannot be read, whose result is an error, or
whose outputs do not match the config fails alone; an exception from the model fails every request it was
given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from zinfer.client.errors import Cancelled, InternalError, ServerError, Status
from zinfer.client.protocol import Frame
from zinfer.client.worker_protocol import RequestResult as ResultEntry
from zinfer.modelconfig.signature import Signature

from .batch_io import (
    BatchOutcome,
    BatchRequest,
    Opened,
    check_output,
    control_arrays,
    emit,
    error_result,
    model_failure,
    open_requests,
    output_wire,
)
from .cancel_flags import CancelFlags
from .device import CPU, Device
from .model import RequestInputs, RequestModel, RequestResult
from .regions import RegionCache
from .sequence_state import ImplicitStates

log = logging.getLogger(__name__)


def _answer(
    req: BatchRequest,
    rows: int,
    result: RequestResult,
    sig: Signature,
    regions: RegionCache,
    frames: list[Frame],
    device: Device,
) -> ResultEntry:
    """The result entry of one request; its frames are appended to ``frames`` only when it succeeds (they
    go straight to the end of ``frames``, numbered there, and are taken off again when an output fails)."""
    if isinstance(result, ServerError):
        return error_result(req.id, result)
    base = len(frames)
    try:
        if type(result) is not dict and not isinstance(result, Mapping):  # a dict: no ABC check
            raise InternalError(f"model returned {type(result).__name__} for a request, expected outputs")
        tensors = []
        for want in req.outputs:
            name = want.name
            if name not in result:
                missing = [o.name for o in req.outputs if o.name not in result]
                raise InternalError(f"response has no output named {', '.join(repr(m) for m in missing)}")
            arr = check_output(name, result[name], sig, rows, device, per_request=True)
            alias = req.inputs if want.alias else ()  # the client lets an output name an input's range
            wire = output_wire(name, arr, sig)
            tensors.append(emit(name, arr, want.slot, wire, regions, frames, device, alias))
    except ServerError as exc:
        del frames[base:]
        return error_result(req.id, exc)
    except BaseException:
        del frames[base:]
        raise
    parameters = getattr(result, "parameters", None)  # a Triton response's, for the client
    if parameters:
        return ResultEntry(req.id, outputs=tuple(tensors), parameters=parameters)
    return ResultEntry(req.id, outputs=tuple(tensors))


def open_inputs(
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    states: ImplicitStates | None,
    cancels: CancelFlags | None,
    out: BatchOutcome,
) -> tuple[list[Opened], list[RequestInputs]]:
    """Each readable request and what the model gets for it (a request whose inputs cannot be read is
    answered in ``out`` now); ``cancels``: the worker's flags, which ``is_cancelled()`` reads."""
    runnable = open_requests(requests, frames, regions, sig.batching, out)
    inputs: list[RequestInputs] = []
    flags = cancels.flags([one.req.id for one in runnable]) if cancels is not None else None
    for k, (req, arrays, _) in enumerate(runnable):
        if req.sequence is not None:  # a sequence request's START, END, READY, CORRID
            arrays.update(control_arrays([req], sig.batching))
        if states is not None:
            arrays.update(states.request_inputs(req))  # and its implicit state
        names = tuple([o.name for o in req.outputs])
        # every field given: the tuple made directly, without the Python-level ``__new__`` a NamedTuple has
        flag = None if flags is None else flags[k]
        inputs.append(tuple.__new__(RequestInputs, (req.request_id, arrays, names, req.sequence,
                                                    req.parameters, flag)))  # fmt: skip
    return runnable, inputs


def answer_all(
    sig: Signature,
    runnable: Sequence[Opened],
    results: Sequence[RequestResult],
    regions: RegionCache,
    device: Device,
    states: ImplicitStates | None,
    out: BatchOutcome,
) -> None:
    """Each request's result into ``out``: its outputs written (into its slots, or as frames), or its
    error; a sequence request's implicit state kept."""
    for (req, _, rows), result in zip(runnable, results, strict=True):
        if states is not None and isinstance(result, Mapping):
            try:
                states.update([req], result, device)
            except ServerError as refused:
                result = refused
        try:
            out.results.append(_answer(req, rows, result, sig, regions, out.frames, device))
        except Exception as exc:  # a device copy that failed
            out.results.append(error_result(req.id, InternalError(f"could not write the outputs: {exc}")))
    try:
        device.synchronize()
    except Exception as exc:
        out.frames.clear()
        failure = InternalError(f"could not write the outputs: {exc}")
        out.results = [error_result(r.id, failure) if r.status == Status.OK else r for r in out.results]


def run_requests(
    model: RequestModel,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device = CPU,
    states: ImplicitStates | None = None,
    serial: bool = False,
    cancels: CancelFlags | None = None,
) -> BatchOutcome:
    """``serial``: a run (``Execute.serial``), each request its own execution (``_one_by_one``);
    ``cancels``: the worker's flags, which the requests' ``is_cancelled()`` read (none cancelled if None)."""
    out = BatchOutcome()
    t0 = time.perf_counter_ns()
    runnable, inputs = open_inputs(sig, requests, frames, regions, states, cancels, out)
    t1 = time.perf_counter_ns()
    if not runnable:
        return out
    if serial:
        results = _one_by_one(model, sig, inputs)
    else:
        try:
            results = _execute(model, inputs, sig.name)
        except ServerError as exc:
            out.results.extend(error_result(one.req.id, exc) for one in runnable)
            return out
    t2 = time.perf_counter_ns()
    answer_all(sig, runnable, results, regions, device, states, out)
    t3 = time.perf_counter_ns()
    out.input_ns, out.infer_ns, out.output_ns = t1 - t0, t2 - t1, t3 - t2
    return out


def _execute(model: RequestModel, inputs: list[RequestInputs], name: str) -> list[RequestResult]:
    """One execution of ``inputs``: a result each, or the ServerError that fails them all (a model's own
    exception becomes one, logged)."""
    try:
        results = list(model.execute_requests(inputs))
    except ServerError:
        raise
    except Exception as exc:
        log.warning("event=model_failed model=%s error=%r", name, exc, exc_info=True)
        raise model_failure(exc, name) from exc
    if len(results) != len(inputs):
        raise InternalError(f"model returned {len(results)} results for {len(inputs)} requests")
    return results


def _one_by_one(model: RequestModel, sig: Signature, inputs: list[RequestInputs]) -> list[RequestResult]:
    """Each request its own execution, in order; a failure fails that request only, and a request
    cancelled before its turn is answered as cancelled without running."""
    results: list[RequestResult] = []
    for one in inputs:
        if one.cancelled is not None and one.cancelled.is_set():
            results.append(Cancelled("the request was cancelled"))
            continue
        try:
            results.extend(_execute(model, [one], sig.name))
        except ServerError as exc:
            results.append(exc)
    return results
