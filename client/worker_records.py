"""The per-request records of the broker<->worker half of the wire contract, each declared once as a
msgspec ``Struct`` (as ``wire_records`` does for the client half; not compiled with mypyc either).
No ``__post_init__`` (it would run as interpreted code for every record decoded or built): the decoders
(``worker_protocol``) check each tensor and make decoded parameters read-only, for model code.

``worker_protocol`` turns a header's entries into these in C and, for what msgspec refuses, runs its
field-by-field checks, which accept exactly the same and name the fault; the bounds here are never looser.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from .errors import Status
from .wire_records import MAX_NAME, MAX_TENSORS, Count, Name, Outputs, Tensors, _Record

MAX_REQUESTS = 1 << 16
"""The most requests one EXECUTE or RESULT names (msgpack's array cap of ``protocol.unpack_header``)."""
MAX_REGIONS = 1 << 12
"""The most client regions one EXECUTE names (msgpack's map cap of ``protocol.unpack_header``)."""

__all__ = [
    "MAX_REGIONS",
    "MAX_REQUESTS",
    "NO_PARAMETERS",
    "NO_REGIONS",
    "Execute",
    "ExecuteRequest",
    "RequestResult",
    "SequenceControl",
    "SequenceFlags",
    "Timings",
    "WorkerResult",
]

MAX_PARAMETER_TEXT = 1 << 12
"""The longest string value of a request parameter the worker takes."""

ParameterValue = bool | int | float | str
NO_PARAMETERS: Mapping[str, ParameterValue] = MappingProxyType({})
_Parameters = Annotated[
    dict[Name, bool | int | float | Annotated[str, msgspec.Meta(max_length=MAX_PARAMETER_TEXT)]],
    msgspec.Meta(max_length=MAX_TENSORS),
]
U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgpack's integers stop at 2**64
_SequenceId = U64 | Annotated[str, msgspec.Meta(max_length=MAX_NAME)]  # ints to 2**64, as the checks


class SequenceControl(_Record, frozen=True, omit_defaults=True):
    """One control input of a sequence model (``sequence_batching.control_input``), as the worker builds
    it: its input name, kind, config data type and, but for CORRID, its ``[false, true]`` values."""

    name: Name
    kind: Literal["START", "END", "READY", "CORRID"]
    data_type: Name  # TYPE_*
    values: Annotated[tuple[bool | int | float, ...], msgspec.Meta(max_length=2)] = ()


class SequenceFlags(_Record, frozen=True):
    """A sequence request's id and flags, and the model's control inputs the worker adds to its batch."""

    id: _SequenceId
    start: bool = False
    end: bool = False
    controls: Annotated[tuple[SequenceControl, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()


# Absent (None, or no parameters) in the record, never null on the wire (see ``wire_records``).
if TYPE_CHECKING:
    AbsentSequence = SequenceFlags | None
    AbsentBool = bool | None
    Parameters = Mapping[str, ParameterValue]
else:
    AbsentSequence, AbsentBool, Parameters = SequenceFlags, bool, _Parameters


class ExecuteRequest(_Record, frozen=True, omit_defaults=True):
    """One request of an EXECUTE. ``id`` is the broker's number for it (its RESULT entry names it);
    ``request_id`` is the id its client gave it (``""`` if none), which Triton-style models read."""

    id: Count
    inputs: Tensors
    outputs: Outputs
    request_id: str = ""
    sequence: AbsentSequence = None
    parameters: Parameters = NO_PARAMETERS  # the client's, for model code (read-only once decoded)


class RequestResult(_Record, frozen=True, omit_defaults=True):
    """One request's answer in a RESULT: its outputs (inline frames numbered across the RESULT), or a
    status and the error text ``"Class: message"``. A decoupled model's entries carry ``final``: False on
    each response of its stream, True on the last (which has no outputs)."""

    id: Count
    status: Status = Status.OK
    error: str = ""
    outputs: Tensors = ()
    final: AbsentBool = None
    parameters: Parameters = NO_PARAMETERS  # a Triton response's parameters (read-only once decoded)


NO_REGIONS: Mapping[str, tuple[int, int, int]] = MappingProxyType({})
_Regions = Annotated[dict[Name, tuple[U64, U64, U64]], msgspec.Meta(max_length=MAX_REGIONS)]
if TYPE_CHECKING:
    Regions = Mapping[str, tuple[int, int, int]]
else:
    Regions = _Regions


class Execute(_Record, frozen=True, omit_defaults=True):
    """W_EXECUTE: a batch. Inline input frames are numbered across the whole batch. ``regions`` names,
    for each client region the batch touches, how the worker reaches and checks it: ``(fd, dev, ino)``
    of the broker's descriptor; regions absent from it are the server's own. ``serial``: a run, not a
    batch: each request is its own execution, one after the other (a model without dynamic batching),
    answered together in one RESULT."""

    batch: Count
    requests: Annotated[tuple[ExecuteRequest, ...], msgspec.Meta(max_length=MAX_REQUESTS)]
    regions: Regions = NO_REGIONS
    serial: bool = False


Timings = tuple[int, int, int]
"""Nanoseconds the worker spent gathering the inputs, in the model, and scattering the outputs."""
if TYPE_CHECKING:
    WireTimings = Timings
else:
    WireTimings = tuple[Count, Count, Count]


class WorkerResult(_Record, frozen=True, omit_defaults=True):
    """W_RESULT: the answers to a batch. ``partial`` ones carry a decoupled model's responses while the
    batch still runs (no timings); the last RESULT of a batch is not partial and ends it."""

    batch: Count
    results: Annotated[tuple[RequestResult, ...], msgspec.Meta(max_length=MAX_REQUESTS)]
    partial: bool = False
    timings: WireTimings = msgspec.field(default=(0, 0, 0), name="t")
