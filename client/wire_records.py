"""The per-request records of the client half of the wire contract, each declared once as a msgspec
``Struct``: its fields, their wire names and their bounds in one place.

A header that arrives is turned into its record by msgspec in C, straight from its bytes (a lone INFER,
EXECUTE or RESULT: ``protocol.decode_typed``) or from its map (``msgspec.convert``): types, lengths and
ranges checked, unknown keys refused; what msgspec refuses goes through ``protocol``'s field-by-field
checks, which accept exactly the same and name what is wrong in the words the error replies have always
used. The bounds here are never looser than those checks: anything the Struct takes, they take too.

This module is not compiled with mypyc (``zinfer.broker.compiled``): mypyc takes no ``Struct`` subclasses.
The records are immutable (``frozen``), as the NamedTuples they replace were, and as cheap to build.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, Self

import msgspec
import msgspec.structs

from .errors import Status

__all__ = [
    "NO_PARAMETERS",
    "InferRequest",
    "OutputRequest",
    "Reply",
    "ShmRef",
    "TensorRef",
]

MAX_NAME = 256
MAX_DIMS = 16
MAX_TENSORS = 256
_INT63_MAX = (1 << 63) - 1  # msgspec takes int64 bounds: below 2**63 is at most 2**63 - 1

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_INT63_MAX)]
Dim = Annotated[int, msgspec.Meta(ge=0, lt=1 << 40)]
FrameNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_TENSORS)]


class ShmRef(NamedTuple):
    """A byte range of a registered region; on the wire ``[region, offset, nbytes]`` (a NamedTuple, which
    msgspec reads as that array with each item's bounds; it compares equal to a plain tuple)."""

    region: Name
    offset: Count
    nbytes: Count


# A field that may be absent (None in the record) but is never null on the wire, as the field-by-field
# checks have it: readers see ``X | None``; msgspec, which reads the annotations at run time, sees ``X``
# (absent takes the default None; an explicit null is refused).
if TYPE_CHECKING:
    AbsentShm = ShmRef | None
    AbsentFrame = FrameNumber | None
else:
    AbsentShm, AbsentFrame = ShmRef, FrameNumber


# Unknown keys are refused here (``forbid_unknown_fields``), so a header with one goes through the checks,
# which ignore it but bound its contents (``protocol.decode``'s msgpack caps); the Struct never skips bytes.
class _Record(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    def _replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (the NamedTuples' name for it, which these records replace)."""
        return msgspec.structs.replace(self, **changes)


class TensorRef(_Record, frozen=True, omit_defaults=True):
    """A tensor: its bytes are either in a region (``shm``) or in inline frame number ``frame``.

    Exactly one of the two: the decoders check that where a header comes in (``protocol.tensors_named``),
    not the record (a ``__post_init__`` would run as interpreted code for every tensor decoded or built).
    """

    name: Name
    datatype: Name
    shape: Annotated[tuple[Dim, ...], msgspec.Meta(max_length=MAX_DIMS)]
    shm: AbsentShm = None
    frame: AbsentFrame = None


class OutputRequest(_Record, frozen=True, omit_defaults=True):
    """An output the client wants; ``slot`` is where the client would like its bytes written. ``alias``: the
    client lets the worker name, instead, the range of one of the request's shared-memory inputs that holds
    the output's bytes (an output that is an input's memory, unchanged: no copy). The client sets it only
    where every such input is memory of its own that it keeps, unchanged, as long as the output lives."""

    name: Name
    slot: AbsentShm = None
    alias: bool = False


Tensors = Annotated[tuple[TensorRef, ...], msgspec.Meta(max_length=MAX_TENSORS)]
Outputs = Annotated[tuple[OutputRequest, ...], msgspec.Meta(max_length=MAX_TENSORS)]
if TYPE_CHECKING:
    AbsentOutputs = Outputs | None
else:
    AbsentOutputs = Outputs

NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


class InferRequest(_Record, frozen=True, omit_defaults=True):
    """INFER's header."""

    request_id: str = msgspec.field(name="id")
    model: Name
    version: Count  # 0 = the server's choice (latest ready)
    inputs: Tensors
    outputs: AbsentOutputs = None  # None: every output
    priority: Count = 0
    timeout_us: Count = 0
    parameters: Mapping[str, Any] = NO_PARAMETERS
    caller_id: str = ""  # the id the user gave the request ("" if none); request_id is the wire's


class Reply(_Record, frozen=True, omit_defaults=True):
    """REPLY's header; ``status`` an unknown code is read as INTERNAL (by ``protocol.reply_from_wire``)."""

    request_id: str = msgspec.field(name="id")
    status: Status
    error: str = ""
    body: Any = None


# A reply's body as msgspec reads it within ``protocol._unpack``'s msgpack caps: maps of at most 4096
# entries keyed by strings, arrays of at most 65536 items, scalars (no bytes: msgspec takes no union of str
# and bytes; no extension types), nested at most ``_BODY_DEPTH`` containers deep. What it refuses, the map
# path reads (and refuses by name where the caps do). An infer reply's body is 4 deep (outputs, a tensor,
# its shape).
_BODY_DEPTH = 6
_Scalar = str | int | float | bool | None


def _capped_body(depth: int) -> Any:
    inner: Any = _Scalar
    for _ in range(depth):
        items = Annotated[list[inner], msgspec.Meta(max_length=1 << 16)]
        entries = Annotated[dict[str, inner], msgspec.Meta(max_length=1 << 12)]
        inner = _Scalar | items | entries
    return inner


if TYPE_CHECKING:
    CappedBody = Any
else:
    CappedBody = _capped_body(_BODY_DEPTH)


class BundledReply(_Record, frozen=True, omit_defaults=True):
    """A REPLY's header in a BUNDLE as the client's typed path reads it (``protocol.decode_replies``): a
    ``Reply`` whose body is bounded as above; the caller makes the ``Reply`` of it."""

    request_id: str = msgspec.field(name="id")
    status: Status
    error: str = ""
    body: CappedBody = None
