"""One EXECUTE in a worker: gather the requests' inputs into batch arrays, run, scatter the outputs."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zinfer.broker.signature import Signature
from zinfer.client import dtypes
from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import Frame, OutputRequest, ShmRef, TensorRef

from .kernels import Alloc, Model, no_alloc
from .regions import RegionCache

Array = npt.NDArray[Any]


class BatchRequest(NamedTuple):
    """One request of a batch as the broker sent it."""

    id: int
    inputs: tuple[TensorRef, ...]
    outputs: tuple[OutputRequest, ...]

    @classmethod
    def from_broker(cls, d: dict[str, Any]) -> BatchRequest:
        """Build from an EXECUTE entry. The broker checked every field when the client sent it."""
        return cls(
            int(d["id"]),
            tuple(
                TensorRef(
                    t["name"],
                    t["datatype"],
                    tuple(t["shape"]),
                    ShmRef(*t["shm"]) if "shm" in t else None,
                    t.get("frame"),
                )
                for t in d["inputs"]
            ),
            tuple(
                OutputRequest(o["name"], ShmRef(*o["slot"]) if "slot" in o else None) for o in d["outputs"]
            ),
        )


@dataclass
class BatchOutcome:
    results: list[dict[str, Any]] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


def _input_array(ref: TensorRef, frames: Sequence[Frame], regions: RegionCache) -> Array:
    if ref.shm is not None:
        raw: Any = regions.bytes(ref.shm)
    else:
        assert ref.frame is not None
        raw = np.frombuffer(frames[ref.frame], dtype=np.uint8)
    if ref.datatype == dtypes.BYTES:
        return dtypes.deserialize_bytes(raw, ref.shape)
    arr: Array = raw.view(dtypes.wire_to_numpy(ref.datatype)).reshape(ref.shape)
    arr.flags.writeable = False  # the client's memory: models must not write into their inputs
    return arr


def gather(
    requests: Sequence[BatchRequest], frames: Sequence[Frame], regions: RegionCache, batching: bool
) -> tuple[dict[str, Array], list[int]]:
    """Batch arrays by input name, and each request's row count."""
    per_name: dict[str, list[Array]] = {}
    rows: list[int] = []
    for req in requests:
        arrays = {ref.name: _input_array(ref, frames, regions) for ref in req.inputs}
        for name, arr in arrays.items():
            per_name.setdefault(name, []).append(arr)
        first = next(iter(arrays.values()), None)
        rows.append(int(first.shape[0]) if batching and first is not None and first.ndim else 1)
    batch = {n: (a[0] if len(a) == 1 else np.concatenate(a, axis=0)) for n, a in per_name.items()}
    return batch, rows


def _check_output(name: str, value: Any, sig: Signature, total_rows: int) -> Array:
    spec = sig.outputs[name]
    arr = np.asarray(value)
    if spec.wire == dtypes.BYTES:
        if arr.dtype.kind not in "OSU":
            raise InternalError(f"output {name!r} must hold bytes or strings, got {arr.dtype}")
    elif arr.dtype != spec.dtype:
        raise InternalError(f"output {name!r} has dtype {arr.dtype}, the config says {spec.config_type}")
    dims = spec.dims
    if sig.batching:
        if arr.ndim == 0 or arr.shape[0] != total_rows:
            got = arr.shape[0] if arr.ndim else "no batch dimension"
            raise InternalError(
                f"output {name!r} has batch size {got}, the inputs had {total_rows}: "
                "a model must return one output row per input row"
            )
        body = arr.shape[1:]
    else:
        body = arr.shape
    if len(body) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, body, strict=True)):
        raise InternalError(f"output {name!r} has shape {list(arr.shape)}, the config says dims {list(dims)}")
    return arr


def _slot_alloc(req: BatchRequest, regions: RegionCache) -> Alloc:
    """Offer a lone request's output slots to the kernel, each once, when the result fits."""
    slots = {o.name: o.slot for o in req.outputs if o.slot is not None}

    def alloc(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array | None:
        slot = slots.pop(name, None)
        nbytes = math.prod(shape) * dtype.itemsize
        if slot is None or dtype.kind in "OSU" or nbytes > slot.nbytes:
            return None
        view: Array = regions.bytes(ShmRef(slot.region, slot.offset, nbytes)).view(dtype).reshape(shape)
        return view

    return alloc if slots else no_alloc


def _emit(
    name: str, piece: Array, slot: ShmRef | None, wire: str, regions: RegionCache, frames: list[Frame]
) -> dict[str, Any]:
    shape = list(piece.shape)
    data: Any = dtypes.serialize_bytes(piece) if wire == dtypes.BYTES else np.ascontiguousarray(piece)
    nbytes = len(data) if isinstance(data, bytes) else data.nbytes
    if slot is not None and nbytes <= slot.nbytes:
        dst = regions.bytes(ShmRef(slot.region, slot.offset, nbytes))
        if not isinstance(data, bytes) and data.ctypes.data == dst.ctypes.data:  # the kernel wrote it there
            return {"name": name, "datatype": wire, "shape": shape, "shm": [slot.region, slot.offset, nbytes]}
        dst[:] = (
            np.frombuffer(data, dtype=np.uint8)
            if isinstance(data, bytes)
            else data.reshape(-1).view(np.uint8)
        )
        return {"name": name, "datatype": wire, "shape": shape, "shm": [slot.region, slot.offset, nbytes]}
    frames.append(data if isinstance(data, bytes) else memoryview(data.reshape(-1).view(np.uint8)))
    return {"name": name, "datatype": wire, "shape": shape, "frame": len(frames) - 1}


def scatter(
    requests: Sequence[BatchRequest],
    rows: Sequence[int],
    outputs: Mapping[str, Array],
    sig: Signature,
    regions: RegionCache,
    out: BatchOutcome,
) -> None:
    start = 0
    batching = sig.batching
    for req, n in zip(requests, rows, strict=True):
        tensors = []
        for want in req.outputs:
            full = outputs[want.name]
            piece = full[start : start + n] if batching else full
            tensors.append(
                _emit(want.name, piece, want.slot, sig.outputs[want.name].wire, regions, out.frames)
            )
        out.results.append({"id": req.id, "status": 0, "outputs": tensors})
        start += n


def _fail_all(requests: Sequence[BatchRequest], exc: ServerError, out: BatchOutcome) -> None:
    out.frames.clear()
    out.results = [{"id": r.id, "status": int(exc.status), "error": exc.wire_text()} for r in requests]


def run_batch(
    model: Model,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
) -> BatchOutcome:
    """Execute one batch; every failure becomes an error result for the requests it touches."""
    out = BatchOutcome()
    regions.begin_batch()
    t0 = time.perf_counter_ns()
    try:
        batch, rows = gather(requests, frames, regions, sig.batching)
    except ServerError:
        # one request's bad input must not fail the others: run them one by one to find it
        return _run_singly(model, sig, requests, frames, regions)
    t1 = time.perf_counter_ns()
    try:
        if len(requests) == 1 and getattr(model, "writes_into_slots", False):
            raw = model.execute(batch, _slot_alloc(requests[0], regions))  # type: ignore[call-arg]
        else:
            raw = model.execute(batch)
        if not isinstance(raw, Mapping):
            raise InternalError(f"model returned {type(raw).__name__}, expected a dict of arrays")
        wanted = {o.name for r in requests for o in r.outputs}
        missing = sorted(wanted - set(raw))
        if missing:
            raise InternalError(f"model returned no output named {', '.join(repr(m) for m in missing)}")
        outputs = {n: _check_output(n, raw[n], sig, sum(rows)) for n in wanted}
    except ServerError as exc:
        _fail_all(requests, exc, out)
        return out
    except Exception as exc:  # the model's own failure fails this batch only
        _fail_all(requests, InternalError(f"model raised {type(exc).__name__}: {exc}"), out)
        return out
    t2 = time.perf_counter_ns()
    try:
        scatter(requests, rows, outputs, sig, regions, out)
    except ServerError as exc:
        _fail_all(requests, exc, out)
    t3 = time.perf_counter_ns()
    out.input_ns, out.infer_ns, out.output_ns = t1 - t0, t2 - t1, t3 - t2
    return out


def _run_singly(
    model: Model,
    sig: Signature,
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
) -> BatchOutcome:
    out = BatchOutcome()
    for req in requests:
        try:
            gather([req], frames, regions, sig.batching)
        except ServerError as exc:
            out.results.append({"id": req.id, "status": int(exc.status), "error": exc.wire_text()})
            continue
        one = run_batch(model, sig, [req], frames, regions)
        base = len(out.frames)
        for res in one.results:
            for t in res.get("outputs", []):
                if "frame" in t:
                    t["frame"] += base
        out.results.extend(one.results)
        out.frames.extend(one.frames)
        out.input_ns += one.input_ns
        out.infer_ns += one.infer_ns
        out.output_ns += one.output_ns
    return out
