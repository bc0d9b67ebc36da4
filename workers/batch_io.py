"""The pieces of an EXECUTE shared by both batch runners: requests, input arrays, output checks and emits."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import numpy as np

from zinfer.client import dtypes
from zinfer.client.errors import InternalError, ServerError
from zinfer.client.protocol import COPY_THRESHOLD, Frame, OutputRequest, ShmRef, TensorRef
from zinfer.client.worker_protocol import NO_PARAMETERS, ExecuteRequest, RequestResult, sequence_to_wire
from zinfer.modelconfig.sequence_batching import control_value
from zinfer.modelconfig.signature import Signature, TensorSpec

from .device import CPU, Device
from .model import Alloc, Array, no_alloc
from .regions import RegionCache

log = logging.getLogger(__name__)


class BatchRequest(NamedTuple):
    """One request of a batch as the broker sent it."""

    id: int
    inputs: tuple[TensorRef, ...]
    outputs: tuple[OutputRequest, ...]
    request_id: str = ""  # the id its client gave it ("" if none)
    sequence: dict[str, Any] | None = None  # a sequence request: id, start, end and the control inputs
    parameters: Mapping[str, Any] = NO_PARAMETERS  # the client's request parameters

    @classmethod
    def from_broker(cls, r: ExecuteRequest) -> BatchRequest:
        """Build from an EXECUTE's request; its sequence becomes the mapping model code sees (the wire's)."""
        return batch_request(r)


def batch_request(r: ExecuteRequest) -> BatchRequest:
    """``BatchRequest.from_broker`` as a plain function (compiled: a direct call, not through the class)."""
    sequence = None if r.sequence is None else sequence_to_wire(r.sequence)
    # every field given: the tuple made directly, without the Python-level ``__new__`` a NamedTuple has
    return tuple.__new__(BatchRequest, (r.id, r.inputs, r.outputs, r.request_id, sequence, r.parameters))


class BatchOutcome:
    """A result per request, the frames they number, the batch's timings. Not a dataclass: compiled, its
    ``__init__`` would be the interpreted one ``dataclasses`` writes, and one is made per EXECUTE."""

    __slots__ = ("frames", "infer_ns", "input_ns", "output_ns", "results")

    def __init__(self, results: list[RequestResult] | None = None, frames: list[Frame] | None = None,
                 input_ns: int = 0, infer_ns: int = 0, output_ns: int = 0) -> None:  # fmt: skip
        self.results: list[RequestResult] = [] if results is None else results
        self.frames: list[Frame] = [] if frames is None else frames
        self.input_ns, self.infer_ns, self.output_ns = input_ns, infer_ns, output_ns

    def __repr__(self) -> str:
        return (f"BatchOutcome(results={self.results!r}, frames={self.frames!r}, input_ns={self.input_ns}, "
                f"infer_ns={self.infer_ns}, output_ns={self.output_ns})")  # fmt: skip


_WIRE_DTYPES: Final = {w: dtypes.wire_to_numpy(w) for w in dtypes.WIRE_TYPES if w != dtypes.BYTES}


def input_array(ref: TensorRef, frames: Sequence[Frame], regions: RegionCache) -> Array:
    """One input as a host array over the client's memory (or the inline frame), read-only."""
    if ref.datatype != dtypes.BYTES:
        # the usual: one array straight over the region's range or the frame (a uint8 array first, then
        # this one, cost twice as much); None when the bytes are not exactly the shape's (below says why)
        known = _WIRE_DTYPES.get(ref.datatype)  # (not ``or``: a dtype's truth is its field count, 0)
        dtype = dtypes.wire_to_numpy(ref.datatype) if known is None else known
        if ref.shm is not None:
            fast = regions.array(ref.shm, ref.shape, dtype)
        else:
            assert ref.frame is not None
            frame = frames[ref.frame]
            # the worker's own frames (``recv_buffers``): bytes views over libzmq's messages
            fast = None
            if type(frame) is memoryview and frame.itemsize == 1:
                fast = _over(frame, ref.shape, dtype)
        if fast is not None:
            # the client's memory: models must not write into their inputs (``setflags``: one call, where
            # ``flags.writeable = False`` makes a flags object first, 110 vs 210 ns)
            fast.setflags(write=False)
            return fast
    if ref.shm is not None:
        raw: Any = regions.bytes(ref.shm)
    else:
        assert ref.frame is not None
        raw = np.frombuffer(frames[ref.frame], dtype=np.uint8)
    if ref.datatype == dtypes.BYTES:
        return dtypes.deserialize_bytes(raw, ref.shape)
    dtype = dtypes.wire_to_numpy(ref.datatype)
    try:  # one array over the bytes, in one call (a view, then a reshape, cost twice as much)
        arr: Array = np.ndarray(ref.shape, dtype, raw)
    except (TypeError, ValueError):  # too few bytes for the shape: the view below says what is wrong
        arr = raw[:0]
    if arr.nbytes != raw.nbytes:  # not exactly the shape's bytes (the broker checked that they are)
        arr = raw.view(dtype).reshape(ref.shape)
    arr.setflags(write=False)  # the client's memory: models must not write into their inputs
    return arr


def _over(buf: memoryview, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array | None:
    """An array of ``shape`` over all of ``buf``; None when ``buf`` is not exactly its bytes."""
    try:
        arr: Array = np.ndarray(shape, dtype, buf)
    except (TypeError, ValueError):
        return None
    return arr if arr.nbytes == buf.nbytes else None


def request_arrays(req: BatchRequest, frames: Sequence[Frame], regions: RegionCache) -> dict[str, Array]:
    return {ref.name: input_array(ref, frames, regions) for ref in req.inputs}


class Opened(NamedTuple):
    """A request whose inputs could be read: its host arrays and its row count."""

    req: BatchRequest
    arrays: dict[str, Array]
    rows: int


def open_requests(
    requests: Sequence[BatchRequest],
    frames: Sequence[Frame],
    regions: RegionCache,
    batching: bool,
    out: BatchOutcome,
    final: bool = False,
) -> list[Opened]:
    """The opening of a request-by-request runner: a new batch for the region cache, then each request's
    arrays and rows; a request whose inputs cannot be read is answered in ``out`` now (``final``: as the
    last response of a decoupled request) and left out."""
    regions.begin_batch()
    opened: list[Opened] = []
    for req in requests:
        try:
            arrays = request_arrays(req, frames, regions)
        except ServerError as exc:
            bad = error_result(req.id, exc)
            out.results.append(bad._replace(final=True) if final else bad)
            continue
        # the tuple made directly, without the Python-level ``__new__`` a NamedTuple has (per request)
        opened.append(tuple.__new__(Opened, (req, arrays, request_rows(arrays, batching))))
    return opened


def unreachable(requests: Sequence[BatchRequest], regions: RegionCache) -> dict[int, ServerError]:
    """The requests (by id) whose shared-memory ranges, inputs or output slots, cannot be reached (a region
    gone, another file, a mapping refused, a range outside): each such request fails alone, with its own
    error, and the rest of its batch runs. Every region the others name is mapped once this returns."""
    bad: dict[int, ServerError] = {}
    for req in requests:
        try:
            for ref in req.inputs:
                if ref.shm is not None:
                    regions.check(ref.shm)
            for out in req.outputs:
                if out.slot is not None:
                    regions.check(out.slot)
        except ServerError as exc:
            bad[req.id] = exc
    return bad


def control_arrays(requests: Sequence[BatchRequest], batching: bool) -> dict[str, Array]:
    """The sequence control inputs of a batch (START, END, READY, CORRID as the config names them):
    one row per request, shape ``[rows, 1]`` (``[1]`` without batching); empty for other models."""
    seqs = [r.sequence for r in requests]
    first = seqs[0] if seqs else None
    if first is None or not first.get("controls"):
        return {}
    out: dict[str, Array] = {}
    for spec in first["controls"]:
        dtype = np.dtype(object) if spec["data_type"] == "TYPE_STRING" else dtypes.wire_to_numpy(
            dtypes.config_to_wire(spec["data_type"])
        )  # fmt: skip
        values = [control_value(spec, s or {}) for s in seqs]
        arr = np.array(values, dtype=dtype).reshape(-1, 1)
        out[spec["name"]] = arr if batching else arr.reshape(-1)[:1]
    return out


def request_rows(arrays: dict[str, Array], batching: bool) -> int:
    first = next(iter(arrays.values()), None)
    return int(first.shape[0]) if batching and first is not None and first.ndim else 1


def _fits(dims: Sequence[int], shape: Sequence[int]) -> bool:
    if len(shape) != len(dims):
        return False
    for d, s in zip(dims, shape, strict=True):  # a loop, not all(<generator>): this runs for every output
        if d != -1 and d != s:
            return False
    return True


def check_output(
    name: str, value: Any, sig: Signature, total_rows: int, device: Device = CPU, *, per_request: bool = False
) -> Array:
    """A model's output as an array, checked against the config: dtype, batch size and dims.

    ``per_request``: the output of one request of a Triton python model. Triton passes such an output on
    as the model made it, whatever its dtype, batch size or shape (Triton's own examples return INT64 for
    a TYPE_INT32 output), so no check refuses it here: :func:`passed_output` does that one, and says once
    per model and output what differs from the config."""
    try:
        arr = value if device is CPU and type(value) is np.ndarray else device.as_output(value)
    except Exception as exc:
        raise InternalError(f"output {name!r} is not an array ({type(value).__name__}: {exc})") from None
    spec = sig.outputs[name]
    key = (id(spec), type(arr), arr.dtype, arr.shape, total_rows, per_request, sig.max_batch_size)
    if _PASSED.get(key) is spec:  # this spec passed an output of this kind before: the same verdict
        return arr
    problem = _mismatch(name, arr, sig, total_rows, per_request)
    if problem is None:
        if len(_PASSED) >= MAX_PASSED:
            _PASSED.clear()
        _PASSED[key] = spec  # holding the spec keeps its id from being reused while the entry lives
        return arr
    if per_request:
        if dtypes_of_output(arr) is None:
            raise InternalError(f"output {name!r} has dtype {arr.dtype}, which no tensor type can carry")
        _note_once(sig.name, name, problem)
        return arr
    raise InternalError(problem)


MAX_PASSED = 1024
_PASSED: dict[tuple[Any, ...], TensorSpec] = {}
"""Outputs that passed :func:`_mismatch`, by what its verdict depends on (the output's spec, the array's type,
dtype and shape, the rows, the kind of check, whether the model batches): the same kind of output again (a
Triton model's each request, a kernel's each batch) is not checked afresh. Bounded: cleared when full."""

_NOTED: set[tuple[str, str]] = set()


def _note_once(model: str, output: str, problem: str) -> None:
    """Log, once per model and output, that an output went to the client unlike its config says."""
    if (model, output) in _NOTED:
        return
    _NOTED.add((model, output))
    log.warning("event=output_unlike_config model=%s output=%s detail=%r (passed on as Triton does)",
                model, output, problem)  # fmt: skip


def dtypes_of_output(arr: Array) -> str | None:
    """The wire type of an output array, or None when it has none."""
    try:
        return dtypes.numpy_to_wire(arr.dtype)
    except ServerError:
        return None


def output_wire(name: str, arr: Array, sig: Signature) -> str:
    """The wire type an output goes out as: the config's, or a Triton python model's array's own."""
    wire = sig.outputs[name].wire
    if wire == dtypes.BYTES:
        return wire if arr.dtype.kind in "OSU" else dtypes_of_output(arr) or wire
    if arr.dtype == sig.outputs[name].dtype:
        return wire
    return dtypes_of_output(arr) or wire


def _mismatch(name: str, arr: Array, sig: Signature, total_rows: int, per_request: bool) -> str | None:
    """What about ``arr`` differs from the config's output ``name`` (None when nothing does)."""
    spec = sig.outputs[name]
    if spec.wire == dtypes.BYTES:
        if arr.dtype.kind not in "OSU" or not isinstance(arr, np.ndarray):
            return f"output {name!r} must hold bytes or strings, got {arr.dtype}"
    elif arr.dtype != spec.dtype:
        return f"output {name!r} has dtype {arr.dtype}, the config says {spec.config_type}"
    dims = spec.dims
    if per_request and sig.batching and total_rows == 1 and _fits(dims, arr.shape):
        if not (arr.ndim and arr.shape[0] == 1 and _fits(dims, arr.shape[1:])):
            return None  # the batch dimension of one row left out (Triton's qa sequence_py does this)
    if sig.batching:
        if arr.ndim == 0 or arr.shape[0] != total_rows:
            got = arr.shape[0] if arr.ndim else "no batch dimension"
            return (
                f"output {name!r} has batch size {got}, the inputs had {total_rows}: "
                "a model must return one output row per input row"
            )
        body = arr.shape[1:]
    else:
        body = arr.shape
    if not _fits(dims, body):
        return f"output {name!r} has shape {list(arr.shape)}, the config says dims {list(dims)}"
    return None


def slot_alloc(req: BatchRequest, regions: RegionCache) -> Alloc:
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


def emit(
    name: str,
    piece: Array,
    slot: ShmRef | None,
    wire: str,
    regions: RegionCache,
    frames: list[Frame],
    device: Device = CPU,
    alias_from: Sequence[TensorRef] = (),
) -> TensorRef:
    """One output of one request: into its slot when it fits, else as an inline frame; or, when the client
    allows it (``alias_from``: the request's inputs), as the range of an input that holds it already."""
    # a NumPy array's shape is a tuple of ints already (a device array's may hold other integers)
    shape = piece.shape if type(piece) is np.ndarray else tuple(int(d) for d in piece.shape)
    if wire == dtypes.BYTES:
        data = dtypes.serialize_bytes(piece)
        if slot is not None and len(data) <= slot.nbytes:
            ref = ShmRef(slot.region, slot.offset, len(data))
            regions.bytes(ref)[:] = np.frombuffer(data, np.uint8)
            return TensorRef(name, wire, shape, shm=ref)
        frames.append(data)
        return TensorRef(name, wire, shape, frame=len(frames) - 1)
    nbytes = int(piece.size) * piece.dtype.itemsize
    if alias_from:
        same = aliased(piece, nbytes, alias_from, regions)
        if same is not None:  # the output is an input's memory, unchanged: named where it is, no copy
            return TensorRef(name, wire, shape, shm=same)
    if slot is not None and nbytes <= slot.nbytes:
        ref = tuple.__new__(ShmRef, (slot.region, slot.offset, nbytes))  # ShmRef(...) without its __new__
        # one array over the range in one call (a uint8 view, then a view and a reshape, cost three)
        dst = regions.array(ref, shape, piece.dtype) if type(piece) is np.ndarray else None
        if dst is None:  # a device array's, or a dtype without a buffer format: the views say what fails
            dst = regions.bytes(ref).view(piece.dtype).reshape(piece.shape)
        device.copy_to_host(piece, dst)  # a no-op when the kernel wrote it there
        return TensorRef(name, wire, shape, shm=ref)
    host = np.ascontiguousarray(piece) if device is CPU else device.to_host(piece)  # C-contiguous
    try:  # small: its bytes (copied on the way out anyway; a view costs 4x), else one flat view of them
        frames.append(host.tobytes() if nbytes < COPY_THRESHOLD else host.data.cast("B"))
    except (TypeError, ValueError, NotImplementedError):  # no buffer format (bfloat16), or size 0
        frames.append(host.reshape(-1).view(np.uint8).data)
    return TensorRef(name, wire, shape, frame=len(frames) - 1)


def aliased(piece: Array, nbytes: int, inputs: Sequence[TensorRef], regions: RegionCache) -> ShmRef | None:
    """The range of one of ``inputs``' shared-memory ranges that ``piece`` is, byte for byte (a C-contiguous
    host array over that very memory, as an identity model returns its input); None otherwise. Inputs are
    read-only arrays: a writable ``piece`` is never one (the usual: no address is looked at)."""
    if type(piece) is not np.ndarray or piece.flags.writeable or not piece.flags.c_contiguous or not nbytes:
        return None
    start = piece.__array_interface__["data"][0]
    for ref in inputs:
        shm = ref.shm
        if shm is None or shm.nbytes < nbytes:
            continue
        over = regions.bytes(shm)
        offset = start - over.__array_interface__["data"][0]
        if 0 <= offset <= shm.nbytes - nbytes:
            return ShmRef(shm.region, shm.offset + offset, nbytes)
    return None


def ok_result(req_id: int, outputs: Sequence[TensorRef], base: int = 0) -> RequestResult:
    """A request's outputs; ``base`` is added to their inline frame numbers (frames of the whole RESULT)."""
    if base:
        outputs = [
            t if t.frame is None else TensorRef(t.name, t.datatype, t.shape, None, t.frame + base)
            for t in outputs
        ]
    return RequestResult(req_id, outputs=tuple(outputs))


def error_result(req_id: int, exc: ServerError) -> RequestResult:
    return RequestResult(req_id, exc.status, exc.wire_text())


def fail_all(requests: Sequence[BatchRequest], exc: ServerError, out: BatchOutcome) -> None:
    out.frames.clear()
    out.results = [error_result(r.id, exc) for r in requests]


def model_failure(exc: BaseException, model: str = "") -> InternalError:
    """The error a model's own exception becomes (it fails the requests it touched). ``model`` named: a
    Triton python model's, with Triton's text (clients match on its start)."""
    text = str(exc)
    what = type(exc).__name__ + (f": {text}" if text else "")
    if model:
        return InternalError(f"Failed to process the request(s) for model '{model}', message: {what}")
    return InternalError(f"model raised {what}")
