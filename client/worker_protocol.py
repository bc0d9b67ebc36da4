"""The broker<->worker half of the wire contract: one typed record per command, with its to-wire and
from-wire functions (the frames are drawn in ``zinfer.client.protocol``'s docstring).

It is a sibling of ``protocol`` rather than a part of it so that each file stays one idea: ``protocol``
frames messages and holds the client half; this module holds what only the broker and its workers say to
each other (about 400 lines, one record and its two functions per command, best read side by side).
Both halves share ``protocol``'s tensor records and field checks.

Every ``*_from_wire`` checks each field's type and range and raises ``ProtocolError`` on anything else
(never ``KeyError`` or ``TypeError``): a worker runs user code, so the broker takes nothing it says on
trust, and a worker takes nothing on trust from a socket either. Unknown keys are ignored, so either side
may add an optional field without breaking the other.

EXECUTE, RESULT and their per-request records (EXECUTE's requests, RESULT's entries, sequence flags) are
msgspec Structs declared once in ``worker_records``; a lone EXECUTE or RESULT is read straight from its bytes
into its record (``decode_execute``, ``decode_result``), and a header map into its record in C; what those
refuse goes through the field-by-field checks here, which name the fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgspec
import msgspec.structs

from . import framing, protocol
from .errors import ProtocolError, Status
from .protocol import (
    INT63_LIMIT,
    MAX_NAME,
    MAX_TENSORS,
    Command,
    Frame,
    Message,
    TensorRef,
    _convert,
    _get,
    _int,
    _list,
    _name,
    output_from_wire,
    output_to_wire,
    tensor_from_wire,
    tensor_to_wire,
    tensors_named,
)
from .worker_records import MAX_PARAMETER_TEXT as MAX_PARAMETER_TEXT
from .worker_records import MAX_REGIONS as MAX_REGIONS
from .worker_records import MAX_REQUESTS as MAX_REQUESTS
from .worker_records import NO_PARAMETERS as NO_PARAMETERS
from .worker_records import NO_REGIONS as NO_REGIONS
from .worker_records import Execute as Execute
from .worker_records import ExecuteRequest as ExecuteRequest
from .worker_records import RequestResult as RequestResult
from .worker_records import SequenceControl as SequenceControl
from .worker_records import SequenceFlags as SequenceFlags
from .worker_records import Timings as Timings
from .worker_records import WorkerResult as WorkerResult

CONTROL_KINDS = frozenset({"START", "END", "READY", "CORRID"})
_U64 = 1 << 64
_STATUS_BY_INT = {int(s): s for s in Status}


# ---------------------------------------------------------------------------------------------- W_READY


MAX_SLOT = 64


@dataclass(frozen=True)
class WorkerReady:
    """W_READY: the worker loaded its model and takes batches. ``slot`` 2 asks for a second place among
    the model's idle instances (GPU look-ahead: the next batch may come while one runs); slots up to
    ``MAX_SLOT`` for a model whose batches run side by side (a decoupled ``async def execute``)."""

    model: str
    version: int
    instance: int
    device: str
    pid: int
    slot: int = 1


def ready_to_wire(r: WorkerReady) -> dict[str, Any]:
    d: dict[str, Any] = {"model": r.model, "version": r.version, "instance": r.instance, "device": r.device,
                         "pid": r.pid}  # fmt: skip
    if r.slot != 1:
        d["slot"] = r.slot
    return d


def ready_from_wire(h: Mapping[str, Any]) -> WorkerReady:
    return WorkerReady(
        model=_name(h, "model"),
        version=_int(h, "version"),
        instance=_int(h, "instance"),
        device=_name(h, "device"),
        pid=_int(h, "pid"),
        slot=_int(h, "slot", 1, lo=1, hi=MAX_SLOT),
    )


# ---------------------------------------------------------------------------------------------- W_LOAD_FAILED


@dataclass(frozen=True)
class LoadFailed:
    """W_LOAD_FAILED: the worker could not load its model (it exits next)."""

    error: str


def load_failed_to_wire(r: LoadFailed) -> dict[str, Any]:
    return {"error": r.error}


def load_failed_from_wire(h: Mapping[str, Any]) -> LoadFailed:
    return LoadFailed(_get(h, "error", str, "unknown error"))


# ---------------------------------------------------------------------------------------------- W_DROP_REGION


@dataclass(frozen=True)
class DropRegion:
    """W_DROP_REGION: a client region is no longer registered; the worker unmaps it."""

    name: str


def drop_region_to_wire(r: DropRegion) -> dict[str, Any]:
    return {"name": r.name}


def drop_region_from_wire(h: Mapping[str, Any]) -> DropRegion:
    return DropRegion(_name(h))


# ---------------------------------------------------------------------------------------------- W_HEARTBEAT


@dataclass(frozen=True)
class Heartbeat:
    """W_HEARTBEAT, both ways on the worker's heartbeat socket: an empty header."""


# ---------------------------------------------------------------------------------------------- W_SHUTDOWN


@dataclass(frozen=True)
class Shutdown:
    """W_SHUTDOWN: finalize the model and exit. An empty header."""


def empty_to_wire(_: Heartbeat | Shutdown) -> dict[str, Any]:
    return {}


def heartbeat_from_wire(h: Mapping[str, Any]) -> Heartbeat:
    return Heartbeat()


def shutdown_from_wire(h: Mapping[str, Any]) -> Shutdown:
    return Shutdown()


# ---------------------------------------------------------------------------------------------- W_EXECUTE


def control_to_wire(c: SequenceControl) -> dict[str, Any]:
    d: dict[str, Any] = {"name": c.name, "kind": c.kind, "data_type": c.data_type}
    if c.values:
        d["values"] = list(c.values)
    return d


def control_from_wire(d: Any) -> SequenceControl:
    if not isinstance(d, dict):
        raise ProtocolError("sequence control must be a map")
    kind = _get(d, "kind", str)
    if kind not in CONTROL_KINDS:
        raise ProtocolError(f"sequence control kind must be one of {sorted(CONTROL_KINDS)}")
    values = _list(d, "values", 2, [])
    if not all(isinstance(v, bool | int | float) for v in values):
        raise ProtocolError("sequence control values must be booleans or numbers")
    return SequenceControl(_name(d), kind, _name(d, "data_type"), tuple(values))


def sequence_to_wire(s: SequenceFlags) -> dict[str, Any]:
    """The wire form, which is also the mapping the worker's model code sees as a request's sequence."""
    return {"id": s.id, "start": s.start, "end": s.end, "controls": [control_to_wire(c) for c in s.controls]}


def sequence_from_wire(d: Any) -> SequenceFlags:
    if not isinstance(d, dict):
        raise ProtocolError("sequence must be a map")
    sid = _get(d, "id", (int, str))
    if isinstance(sid, bool) or (isinstance(sid, int) and not 0 <= sid < _U64) or (
        isinstance(sid, str) and len(sid) > MAX_NAME
    ):  # fmt: skip
        raise ProtocolError(f"sequence id must be an integer in [0, 2**64) or at most {MAX_NAME} characters")
    controls = tuple(control_from_wire(c) for c in _list(d, "controls", MAX_TENSORS, []))
    return SequenceFlags(sid, _get(d, "start", bool, False), _get(d, "end", bool, False), controls)


def execute_request_to_wire(r: ExecuteRequest) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": r.id,
        "inputs": [tensor_to_wire(t) for t in r.inputs],
        "outputs": [output_to_wire(o) for o in r.outputs],
    }
    if r.request_id:
        d["request_id"] = r.request_id
    if r.sequence is not None:
        d["sequence"] = sequence_to_wire(r.sequence)
    if r.parameters:
        d["parameters"] = dict(r.parameters)
    return d


def parameters_from_wire(value: Any) -> Mapping[str, bool | int | float | str]:
    """Request parameters as model code sees them: at most ``MAX_TENSORS`` of them, names of at most
    ``MAX_NAME`` characters, values booleans, numbers or strings of at most ``MAX_PARAMETER_TEXT``."""
    if not isinstance(value, dict) or len(value) > MAX_TENSORS:
        raise ProtocolError(f"field 'parameters' must be a map of at most {MAX_TENSORS} entries")
    out: dict[str, bool | int | float | str] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_NAME:
            raise ProtocolError("a parameter name must be a non-empty string")
        too_long = isinstance(v, str) and len(v) > MAX_PARAMETER_TEXT
        if not isinstance(v, bool | int | float | str) or too_long:
            raise ProtocolError(f"parameter {key!r} must be a boolean, a number or a short string")
        out[key] = v
    return MappingProxyType(out)


def _sealed(record: ExecuteRequest | RequestResult, tensors: tuple[TensorRef, ...]) -> bool:
    """Whether a decoded record's tensors are well formed (``protocol.tensors_named``); its parameters, if
    any, made read-only for model code. The records have no ``__post_init__`` to do either: it would run
    as interpreted code for each of them."""
    if not tensors_named(tensors):
        return False
    parameters = record.parameters
    if parameters and type(parameters) is dict:
        _read_only(record, parameters)
    return True


def execute_request_from_wire(d: Any) -> ExecuteRequest:
    """One request of an EXECUTE, every field checked (see :func:`_execute_request_checked` for errors)."""
    try:
        r: ExecuteRequest = _convert(d, ExecuteRequest)
    except msgspec.ValidationError:
        return _execute_request_checked(d)
    return r if _sealed(r, r.inputs) else _execute_request_checked(d)


def _execute_request_checked(d: Any) -> ExecuteRequest:
    if not isinstance(d, dict):
        raise ProtocolError("an EXECUTE request must be a map")
    return ExecuteRequest(
        id=_int(d, "id"),
        inputs=tuple(tensor_from_wire(t) for t in _list(d, "inputs", MAX_TENSORS)),
        outputs=tuple(output_from_wire(o) for o in _list(d, "outputs", MAX_TENSORS)),
        request_id=_get(d, "request_id", str, ""),
        sequence=sequence_from_wire(d["sequence"]) if "sequence" in d else None,
        parameters=parameters_from_wire(d["parameters"]) if "parameters" in d else NO_PARAMETERS,
    )


def execute_to_wire(e: Execute) -> dict[str, Any]:
    d: dict[str, Any] = {"batch": e.batch, "requests": [execute_request_to_wire(r) for r in e.requests]}
    if e.regions:
        d["regions"] = {name: list(wire) for name, wire in e.regions.items()}
    if e.serial:
        d["serial"] = True
    return d


def _region_ids(value: Any) -> dict[str, tuple[int, int, int]]:
    if not isinstance(value, dict) or len(value) > MAX_REGIONS:
        raise ProtocolError(f"field 'regions' must be a map of at most {MAX_REGIONS} entries")
    table: dict[str, tuple[int, int, int]] = {}
    for name, wire in value.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ProtocolError("a region name must be a non-empty string")
        if not (isinstance(wire, list) and len(wire) == 3) or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < _U64 for x in wire
        ):
            raise ProtocolError("a region must be named by [fd, dev, ino], integers in [0, 2**64)")
        table[name] = (wire[0], wire[1], wire[2])
    return table


def _plain_mapping(value: Any) -> Any:
    """A record's read-only mapping (its parameters) as a map; anything else as ``protocol`` encodes it."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    return protocol._as_plain(value)


_pack_record = msgspec.msgpack.Encoder(enc_hook=_plain_mapping).encode
_EXECUTE_HEAD = protocol.PROTOCOL + bytes([Command.W_EXECUTE])
_EXECUTE_PACKED_HEAD = protocol.PROTOCOL + bytes([Command.W_EXECUTE | framing.PACKED])


def encode_execute(e: Execute, frames: Sequence[Frame] = ()) -> list[Frame]:
    """A W_EXECUTE's frames, as ``protocol.encode`` frames a message, its record encoded as it is, in C: the
    map ``execute_to_wire`` writes, but that a sequence's false flags and empty controls are left out (they
    read back as the same record). Empty parameters and regions are left out when they are the records'
    defaults (``NO_PARAMETERS``, ``NO_REGIONS``)."""
    if len(frames) < 2 or not framing.worth_packing(frames):
        return [_EXECUTE_HEAD + _pack_record(e), *frames]
    refs, blob, large = framing.pack(frames)
    return [_EXECUTE_PACKED_HEAD + _pack_record((refs, e)), blob, *large]


_EXECUTE = protocol.typed_decoders(Execute)
_RESULT = protocol.typed_decoders(WorkerResult)


def decode_execute(frames: Sequence[Frame]) -> Message | None:
    """A W_EXECUTE read straight from its header's bytes into its record (``protocol.decode_typed``); None
    for any other message, or one whose header is not a well-formed EXECUTE (``decode`` and
    ``execute_from_wire`` then name the fault)."""
    msg = protocol.decode_typed(frames, Command.W_EXECUTE, _EXECUTE)
    if msg is None:
        return None
    for r in msg.record.requests:
        if not _sealed(r, r.inputs):
            return None
    return msg


def _read_only(record: ExecuteRequest | RequestResult, parameters: dict[str, Any]) -> None:
    msgspec.structs.force_setattr(record, "parameters", MappingProxyType(parameters))


def decode_result(frames: Sequence[Frame]) -> Message | None:
    """A W_RESULT read straight from its bytes, as ``decode_execute`` reads an EXECUTE."""
    msg = protocol.decode_typed(frames, Command.W_RESULT, _RESULT)
    if msg is None:
        return None
    for r in msg.record.results:
        if not _sealed(r, r.outputs):
            return None
    return msg


def execute_from_wire(h: Mapping[str, Any] | Execute) -> Execute:
    """An EXECUTE header as its record, every field checked; a record (``decode_execute``) as it is."""
    if isinstance(h, Execute):
        return h
    return Execute(
        batch=_int(h, "batch"),
        requests=tuple(execute_request_from_wire(r) for r in _list(h, "requests", MAX_REQUESTS)),
        regions=_region_ids(h["regions"]) if "regions" in h else NO_REGIONS,
        serial=_get(h, "serial", bool, False),
    )


# ---------------------------------------------------------------------------------------------- W_CANCEL


@dataclass(frozen=True)
class CancelRequest:
    """W_CANCEL: the client cancelled request ``id`` of the running batch ``batch``; the worker sets its
    cancellation flag (Triton's ``request.is_cancelled()``), and the model may end it early."""

    batch: int
    id: int


def cancel_to_wire(r: CancelRequest) -> dict[str, Any]:
    return {"batch": r.batch, "id": r.id}


def cancel_from_wire(h: Mapping[str, Any]) -> CancelRequest:
    return CancelRequest(_int(h, "batch"), _int(h, "id"))


# ---------------------------------------------------------------------------------------------- W_RESULT


def request_result_to_wire(r: RequestResult) -> dict[str, Any]:
    d: dict[str, Any] = {"id": r.id, "status": int(r.status)}
    if r.error:
        d["error"] = r.error
    if r.outputs:
        d["outputs"] = [tensor_to_wire(t) for t in r.outputs]
    if r.final is not None:
        d["final"] = r.final
    if r.parameters:
        d["parameters"] = dict(r.parameters)
    return d


def request_result_from_wire(d: Any) -> RequestResult:
    """One entry of a RESULT, every field checked (see :func:`_request_result_checked` for the errors)."""
    try:
        r: RequestResult = _convert(d, RequestResult)
    except msgspec.ValidationError:
        return _request_result_checked(d)
    return r if _sealed(r, r.outputs) else _request_result_checked(d)


def _request_result_checked(d: Any) -> RequestResult:
    if not isinstance(d, dict):
        raise ProtocolError("a RESULT entry must be a map")
    status = _STATUS_BY_INT.get(_int(d, "status", 0, lo=0, hi=255), Status.INTERNAL)
    final = _get(d, "final", bool, None) if "final" in d else None
    outputs = tuple(tensor_from_wire(t) for t in _list(d, "outputs", MAX_TENSORS, []))
    parameters = parameters_from_wire(d["parameters"]) if "parameters" in d else NO_PARAMETERS
    return RequestResult(_int(d, "id"), status, _get(d, "error", str, ""), outputs, final, parameters)


def result_to_wire(r: WorkerResult) -> dict[str, Any]:
    d: dict[str, Any] = {"batch": r.batch, "results": [request_result_to_wire(x) for x in r.results]}
    if r.partial:
        d["partial"] = True
    else:
        d["t"] = list(r.timings)
    return d


def result_from_wire(h: Mapping[str, Any] | WorkerResult) -> WorkerResult:
    """A RESULT header as its record, every field checked; a record (``decode_result``) as it is."""
    if isinstance(h, WorkerResult):
        return h
    timings = _list(h, "t", 3, [0, 0, 0])
    if len(timings) != 3 or not all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < INT63_LIMIT for x in timings
    ):
        raise ProtocolError("field 't' must be three durations in nanoseconds")
    return WorkerResult(
        batch=_int(h, "batch"),
        results=tuple(request_result_from_wire(x) for x in _list(h, "results", MAX_REQUESTS)),
        partial=_get(h, "partial", bool, False),
        timings=(timings[0], timings[1], timings[2]),
    )


@dataclass(frozen=True)
class Readiness:
    """W_READINESS: what the model's own ``is_ready()`` answered (a Triton python model that defines it);
    False also when it raised, returned something other than a bool, or did not answer in time."""

    ready: bool


def readiness_to_wire(r: Readiness) -> dict[str, Any]:
    return {"ready": r.ready}


def readiness_from_wire(d: Mapping[str, Any]) -> Readiness:
    return Readiness(_get(d, "ready", bool))
