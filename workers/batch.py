"""One EXECUTE in a worker: gather the requests' inputs into batch arrays, run, scatter the outputs.

On a GPU instance the gather copies each request's rows host-to-device into one device buffer per input,
and the scatter copies each request's rows device-to-host into its output slot; the device is
synchronized before the result is sent. Models that answer request by request (Triton-style model.py)
go through ``zinfer.workers.request_batch`` instead (``zinfer.workers.runners`` picks one per model).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from zinfer.client.errors import Cancelled, InternalError, ServerError, Status
from zinfer.client.protocol import Frame
from zinfer.modelconfig.signature import Signature, TensorSpec

from .batch_io import (
    BatchOutcome,
    BatchRequest,
    check_output,
    control_arrays,
    emit,
    error_result,
    fail_all,
    model_failure,
    ok_result,
    request_arrays,
    request_rows,
    slot_alloc,
    unreachable,
)
from .cancel_flags import CancelFlags
from .device import CPU, Device
from .model import Array, Model
from .regions import RegionCache
from .sequence_state import ImplicitStates

__all__ = ["BatchOutcome", "BatchRequest", "gather", "run_batch", "run_serial", "scatter"]

log = logging.getLogger(__name__)


def gather(
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    batching: bool,
    device: Device = CPU,
    states: ImplicitStates | None = None,
) -> tuple[dict[str, Array], list[int]]:
    """Batch arrays by input name (on the device), and each request's row count; a stateful model's
    control inputs and implicit state inputs too."""
    if len(requests) == 1:  # a lone request (concurrency 1): its arrays are the batch, no lists per name
        arrays = request_arrays(requests[0], frames, regions)
        rows = [request_rows(arrays, batching)]
        # on the host a lone piece is its own batch (``CpuDevice.batch``): the fresh dict itself, no call
        # into the interpreted device per input
        batch = arrays if device is CPU else {n: device.batch([a]) for n, a in arrays.items()}
    else:
        per_name: dict[str, list[Array]] = {}
        rows = []
        for req in requests:
            arrays = request_arrays(req, frames, regions)
            for name, arr in arrays.items():
                per_name.setdefault(name, []).append(arr)
            rows.append(request_rows(arrays, batching))
        batch = {n: device.batch(a) for n, a in per_name.items()}
    if requests and requests[0].sequence is not None:  # only a sequence's requests carry control inputs
        for name, arr in control_arrays(requests, batching).items():
            batch[name] = device.batch([arr])
    if states is not None:
        for name, arr in states.inputs(requests).items():
            batch[name] = device.batch([arr])
    return batch, rows


def scatter(
    requests: Sequence[BatchRequest],
    rows: Sequence[int],
    outputs: Mapping[str, Array],
    sig: Signature,
    regions: RegionCache,
    out: BatchOutcome,
    device: Device = CPU,
) -> None:
    """Each request's rows of the outputs into its slots (or inline frames); a request whose slot cannot be
    written fails alone."""
    start = 0
    batching = sig.max_batch_size > 0  # ``sig.batching``, without the interpreted property
    for req, n in zip(requests, rows, strict=True):
        tensors = []
        own: list[Frame] = []
        try:
            for want in req.outputs:
                full = outputs[want.name]
                piece = full[start : start + n] if batching else full
                wire = sig.outputs[want.name].wire
                alias = req.inputs if want.alias else ()  # the client lets an output name an input's range
                tensors.append(emit(want.name, piece, want.slot, wire, regions, own, device, alias))
        except ServerError as exc:
            out.results.append(error_result(req.id, exc))
        else:
            out.results.append(ok_result(req.id, tensors, len(out.frames)))
            out.frames.extend(own)
        start += n
    if device is not CPU:  # the copies into the slots are done before the reply says so (none on the host)
        device.synchronize()


def _reshape(
    arrays: dict[str, Any], specs: Mapping[str, TensorSpec], batching: bool, to_model: bool
) -> dict[str, Any]:
    """Apply the config's ``reshape``: to the model's shape on the way in, back to ``dims`` on the way out.
    ``arrays`` itself when no spec reshapes (the usual: no copy of the mapping)."""
    if not _reshapes(specs):
        return arrays
    out = dict(arrays)
    for name, arr in arrays.items():
        spec = specs.get(name)
        if spec is None or spec.reshape is None or not hasattr(arr, "reshape"):
            continue
        target = spec.reshape if to_model else spec.dims
        lead = (arr.shape[0],) if batching and arr.ndim else ()
        try:
            out[name] = arr.reshape(lead + tuple(target))
        except ValueError:
            raise InternalError(
                f"{name!r} of shape {list(arr.shape)} cannot take the configured shape {list(target)}"
            ) from None
    return out


_NO_RESHAPE: dict[int, tuple[Mapping[str, TensorSpec], bool]] = {}
"""Whether a model's specs (by ``id``, the mapping kept so the id stays its own) name any ``reshape``: asked
twice per batch, the same answer for the model's life."""


def _reshapes(specs: Mapping[str, TensorSpec]) -> bool:
    known = _NO_RESHAPE.get(id(specs))
    if known is not None and known[0] is specs:
        return known[1]
    any_reshape = any(spec.reshape is not None for spec in specs.values())
    if len(_NO_RESHAPE) >= 64:
        _NO_RESHAPE.clear()
    _NO_RESHAPE[id(specs)] = (specs, any_reshape)
    return any_reshape


def run_batch(
    model: Model,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device = CPU,
    states: ImplicitStates | None = None,
) -> BatchOutcome:
    """Execute one batch; every failure becomes an error result for the requests it touches. ``states``:
    a stateful model's implicit state (read before, kept after a batch that succeeds)."""
    out = BatchOutcome()
    regions.begin_batch()
    bad = unreachable(requests, regions)
    if bad:  # a region that cannot be reached fails only the requests that name it
        out.results.extend(error_result(rid, exc) for rid, exc in bad.items())
        rest = [r for r in requests if r.id not in bad]
        if rest:
            _merge(out, run_batch(model, sig, rest, frames, regions, device, states))
        return out
    t0 = time.perf_counter_ns()
    batching = sig.max_batch_size > 0  # ``sig.batching``, without the interpreted property
    try:
        batch, rows = gather(requests, frames, regions, batching, device, states)
    except ServerError:
        # one request's bad input must not fail the others: run them one by one to find it
        return _run_singly(model, sig, requests, frames, regions, device, states)
    except Exception as exc:  # the device could not take the batch (out of memory, say)
        log.warning("event=gather_failed model=%s error=%r", sig.name, exc)
        fail_all(requests, InternalError(f"could not gather the batch: {type(exc).__name__}: {exc}"), out)
        return out
    t1 = time.perf_counter_ns()
    try:
        batch = _reshape(batch, sig.inputs, batching, to_model=True)
        if len(requests) == 1 and getattr(model, "writes_into_slots", False):
            raw = model.execute(batch, slot_alloc(requests[0], regions))  # type: ignore[call-arg]
        else:
            raw = model.execute(batch)
        if type(raw) is not dict and not isinstance(raw, Mapping):  # a dict: no ABC check
            raise InternalError(f"model returned {type(raw).__name__}, expected a dict of arrays")
        wanted = {o.name for r in requests for o in r.outputs}
        if not wanted <= raw.keys():
            missing = sorted(wanted - set(raw))
            raise InternalError(f"model returned no output named {', '.join(repr(m) for m in missing)}")
        kept = raw
        raw = _reshape({n: raw[n] for n in wanted}, sig.outputs, batching, to_model=False)
        total = rows[0] if len(rows) == 1 else sum(rows)
        outputs = {n: check_output(n, raw[n], sig, total, device) for n in wanted}
        if device is not CPU:  # the host's synchronize does nothing
            device.synchronize()
        if states is not None:
            states.update(requests, kept, device)
    except ServerError as refused:
        fail_all(requests, refused, out)
        return out
    except Exception as exc:  # the model's own failure fails this batch only
        log.warning("event=model_failed model=%s error=%r", sig.name, exc, exc_info=True)
        fail_all(requests, model_failure(exc), out)
        return out
    t2 = time.perf_counter_ns()
    try:
        scatter(requests, rows, outputs, sig, regions, out, device)
    except ServerError as refused:
        fail_all(requests, refused, out)
    except Exception as exc:
        log.warning("event=scatter_failed model=%s error=%r", sig.name, exc)
        fail_all(requests, InternalError(f"could not write the outputs: {type(exc).__name__}: {exc}"), out)
    t3 = time.perf_counter_ns()
    out.input_ns, out.infer_ns, out.output_ns = t1 - t0, t2 - t1, t3 - t2
    return out


def run_serial(
    model: Model,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device = CPU,
    states: ImplicitStates | None = None,
    cancels: CancelFlags | None = None,
) -> BatchOutcome:
    """A run (``Execute.serial``): each request its own execution, in order, answered together. A request
    cancelled before its turn (``cancels``: the worker's flags) is answered as cancelled without running."""
    out = BatchOutcome()
    for req in requests:
        if cancels is not None and cancels.flag(req.id).is_set():
            out.results.append(error_result(req.id, Cancelled("the request was cancelled")))
            continue
        _merge(out, run_batch(model, sig, [req], frames, regions, device, states))
    return out


def _run_singly(
    model: Model,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    device: Device,
    states: ImplicitStates | None = None,
) -> BatchOutcome:
    out = BatchOutcome()
    for req in requests:
        try:
            request_arrays(req, frames, regions)
        except ServerError as exc:
            out.results.append(error_result(req.id, exc))
            continue
        _merge(out, run_batch(model, sig, [req], frames, regions, device, states))
    return out


def _merge(out: BatchOutcome, one: BatchOutcome) -> None:
    """Add one execution's outcome to ``out``: its frames after those already there, renumbered."""
    base = len(out.frames)
    for r in one.results:
        if r.status == Status.OK and base:
            r = ok_result(r.id, r.outputs, base)._replace(parameters=r.parameters)
        out.results.append(r)
    out.frames.extend(one.frames)
    out.input_ns += one.input_ns
    out.infer_ns += one.infer_ns
    out.output_ns += one.output_ns
