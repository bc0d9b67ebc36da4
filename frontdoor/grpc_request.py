"""A ``ModelInferRequest`` read from its wire bytes, for the requests a client sends over and over.

A client's inference requests differ, call after call, only in their tensors' bytes (and perhaps their
id): protobuf writes a message's fields in field-number order, so a ``ModelInferRequest``'s
``raw_input_contents`` (field 7) come last, after a *header* (model, version, parameters, inputs, outputs)
that repeats byte for byte. ``read`` walks the message's top-level fields only (a tag and a length each),
looks the header up among those seen before (``Headers``: what protobuf and ``grpc_convert`` made of it,
checked once), and builds the call from it and the raw contents' bytes (arrays over the message's own
bytes, no copy). Anything it does not recognise, it leaves to the full path (``None``): a field out of
order or repeated, a tag or length protobuf would not write, an input whose data is not raw contents, a
tensor's parameters (shared memory, classification), a request parameter the full path would refuse, a byte
count that does not match, a header not seen yet. The full path (protobuf's parser and
``grpc_convert.infer_call``) then gives every answer and every error text, as before; so this path answers
only requests that the full path would answer the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from tritonclient.grpc import service_pb2

from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument

from .bridge_records import NONE, InferCall, Tensor
from .door_client import with_wire
from .grpc_convert import _ITEMSIZE, _NUMPY, _bool, _int, _sequence_id, _shape, parameters

__all__ = ["Headers", "parse", "read"]

log = logging.getLogger(__name__)

MAX_HEADER = 4096  # longer headers are not kept (each kept one costs its bytes and its template)
MAX_HEADERS = 256  # headers kept per process; the table starts afresh when full

_RAW = 0x3A  # field 7 (raw_input_contents), length-delimited
_ID = 0x1A  # field 3 (id)
# the top-level fields of a ModelInferRequest, all length-delimited, by tag: the field number
_FIELDS = {0x0A: 1, 0x12: 2, 0x1A: 3, 0x22: 4, 0x2A: 5, 0x32: 6, 0x3A: 7}


class _Input(NamedTuple):
    name: str
    datatype: str
    shape: tuple[int, ...]
    nbytes: int  # the raw contents' length (-1: BYTES, checked by decoding)
    dtype: np.dtype[Any] | None


class _Template(NamedTuple):
    model: str
    version: str
    inputs: tuple[_Input, ...]
    outputs: tuple[str, ...]
    priority: int
    timeout_us: int
    sequence_id: int | str
    sequence_start: bool
    sequence_end: bool
    parameters: Mapping[str, Any]


def _template(header: bytes) -> _Template | None:
    """What the full path makes of a request with this header, when it needs nothing of a request but its
    raw contents (None otherwise: it goes the full path every time)."""
    try:
        request = service_pb2.ModelInferRequest.FromString(header)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and the like: the full path answers it
        return None
    if not request.model_name or request.raw_input_contents:
        return None
    entries = request.parameters
    params = parameters(entries) if entries else {}
    try:  # what grpc_convert.infer_call reads of them (a bytes parameter, a wrong type: its errors)
        if any(isinstance(v, bytes) for v in params.values()):
            return None
        fixed = (
            _int(params, "priority"), _int(params, "timeout"), _sequence_id(params),
            _bool(params, "sequence_start"), _bool(params, "sequence_end"),
        )  # fmt: skip
    except InvalidArgument:
        return None
    inputs = []
    seen: set[str] = set()
    for t in request.inputs:
        name, datatype = t.name, t.datatype
        if name in seen or datatype not in _ITEMSIZE or t.parameters or t.HasField("contents"):
            return None
        seen.add(name)
        try:
            shape = _shape(name, t.shape)
        except InvalidArgument:
            return None
        if datatype == dtypes.BYTES:
            inputs.append(_Input(name, datatype, shape, -1, None))
        else:
            count = 1
            for d in shape:
                count *= d
            inputs.append(_Input(name, datatype, shape, count * _ITEMSIZE[datatype], _NUMPY[datatype]))
    outputs = []
    for o in request.outputs:
        if o.parameters:
            return None
        outputs.append(o.name)
    # the request's parameters as infer_call passes them on (read only here: every call of the header shares
    # them), none as its default
    shared = MappingProxyType(params) if params else NONE
    return _Template(request.model_name, request.model_version, tuple(inputs), tuple(outputs), *fixed, shared)


def _varint(payload: bytes, pos: int, end: int) -> tuple[int, int]:
    """A length (at most 4 bytes of varint, as any message under 256 MiB has) and where it ends; -1 when
    it is not one."""
    value = shift = 0
    while pos < end and shift < 28:
        b = payload[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    return -1, pos


Headers = dict[bytes, "_Template | None"]
"""The request headers seen (at most ``MAX_HEADERS``), each with its template (None: the full path's)."""


Last = list[Any]
"""The header and template of the last request read without an id (empty until one is): a request that
starts with that header and goes on with raw contents only is read without walking its header again."""


def read(payload: bytes, known: Headers, recent: Last | None = None) -> InferCall | None:
    """The call of a serialized ``ModelInferRequest``, or None: the full path's to read (``known``: the
    headers seen, added to; ``recent``: the last header read, replaced)."""
    if recent:
        header, template = recent
        at = len(header)
        # the header's bytes are whole fields (walked when it was first read), so a request that starts with
        # them and a raw contents' tag has that header and no id; anything else after them: the walk below
        if at < len(payload) and payload[at] == _RAW and payload.startswith(header):
            found = _raw_fields(payload, at)
            if found is not None and len(found) == len(template.inputs):
                return _call(payload, template, found, "")
    end = len(payload)
    pos = 0
    last = 0
    id_at = id_end = -1
    raw_at = -1
    raws: list[tuple[int, int]] = []
    while pos < end:
        tag = payload[pos]
        field = _FIELDS.get(tag, 0)
        if field == 0 or field < last or (field == last and field <= 3):
            return None  # unknown, out of order, or a scalar twice: the full path's
        at = pos
        size = payload[pos + 1] if pos + 1 < end else 0x80
        if size < 0x80:  # a length under 128: one byte
            pos += 2
        else:
            size, pos = _varint(payload, pos + 1, end)
        if size < 0 or size > end - pos:
            return None
        if tag == _RAW:
            if raw_at < 0:
                raw_at = at
            raws.append((pos, pos + size))
        elif tag == _ID:
            id_at, id_end = at, pos + size
        last = field
        pos += size
    header_end = raw_at if raw_at >= 0 else end
    if header_end - (id_end - id_at) > MAX_HEADER:  # not kept: not copied either
        return None
    if id_at >= 0:
        header = payload[:id_at] + payload[id_end:header_end]
        request_id = _id_value(payload, id_at, id_end)
        if request_id is None:
            return None
    else:
        header = payload[:header_end]
        request_id = ""
    template = known.get(header)
    if template is None:
        if header not in known:  # the first time: the full path, which also says what is wrong with it
            if len(known) >= MAX_HEADERS:
                known.clear()
            known[header] = _template(header)
        return None
    if len(raws) != len(template.inputs):
        return None
    if recent is not None and id_at < 0:
        recent[:] = (header, template)
    return _call(payload, template, raws, request_id)


def _raw_fields(payload: bytes, pos: int) -> list[tuple[int, int]] | None:
    """Where each raw contents' bytes lie, from ``pos`` to the end; None when anything else is there."""
    end = len(payload)
    raws: list[tuple[int, int]] = []
    while pos < end:
        if payload[pos] != _RAW:
            return None
        size = payload[pos + 1] if pos + 1 < end else 0x80
        if size < 0x80:
            pos += 2
        else:
            size, pos = _varint(payload, pos + 1, end)
        if size < 0 or size > end - pos:
            return None
        raws.append((pos, pos + size))
        pos += size
    return raws


def _call(
    payload: bytes, template: _Template, raws: list[tuple[int, int]], request_id: str
) -> InferCall | None:
    """The call of a request with ``template``'s header and these raw contents (None: not as it says)."""
    inputs = []
    for spec, (start, stop) in zip(template.inputs, raws, strict=True):
        if spec.dtype is None:  # BYTES: decoded, so that its items are checked against its shape
            wire = payload[start:stop]
            try:
                items = dtypes.deserialize_bytes(wire, spec.shape)
            except InvalidArgument:
                return None
            data = with_wire(items, wire)
        elif stop - start != spec.nbytes:
            return None
        elif spec.nbytes:
            data = np.ndarray(spec.shape, spec.dtype, payload, start)
        else:
            data = np.empty(spec.shape, spec.dtype)
        inputs.append(Tensor(spec.name, spec.datatype, spec.shape, data))
    t = template
    return InferCall(
        t.model, tuple(inputs), t.version, t.outputs, request_id, t.priority, t.timeout_us, t.sequence_id,
        t.sequence_start, t.sequence_end, t.parameters, {},
    )  # fmt: skip


def _id_value(payload: bytes, at: int, end: int) -> str | None:
    """The id field's text (after its tag and length), or None when it is not UTF-8."""
    _, start = _varint(payload, at + 1, end)
    try:
        return payload[start:end].decode()
    except UnicodeDecodeError:
        return None


def parse(payload: bytes) -> service_pb2.ModelInferRequest | None:
    """A ModelInferRequest from its wire bytes; None (logged) when they are not one."""
    try:
        return service_pb2.ModelInferRequest.FromString(payload)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and whatever else a hostile message raises
        log.warning("event=frontdoor_bad_message protocol=grpc method=ModelInfer bytes=%d", len(payload))
        return None
