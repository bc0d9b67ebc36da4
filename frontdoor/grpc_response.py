"""A ``ModelInferResponse`` written as its wire bytes, for the replies a model gives over and over.

A model's replies differ, call after call, only in their tensors' bytes and the request's id: the rest (the
model, its version, each output's name, data type and shape) is written once per kind of reply and kept
(``Written``); each response is then those bytes, the id and the ``raw_output_contents``, joined once. What
protobuf would write for the same message, field for field (``tests/unit/test_frontdoor_grpc_response.py``
parses both); a reply with parameters of its own goes through the message (``None`` here).
"""

from __future__ import annotations

from typing import Any

from zinfer.client import dtypes

from .bridge_records import InferReply
from .door_client import wire_bytes

__all__ = ["MAX_KINDS", "Written", "response_bytes"]

MAX_KINDS = 256  # kinds of reply kept per process; the table starts afresh when full

Written = dict[Any, tuple[bytes, bytes]]
"""Per kind of reply (model, version, each output's name, data type and shape): the bytes before the id
(model, version) and after it (the outputs)."""

_LENGTHS = [bytes((n,)) for n in range(128)]


def _varint(n: int) -> bytes:
    if n < 128:
        return _LENGTHS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, value: bytes) -> bytes:
    """A length-delimited field (none for an empty value: proto3 writes no default)."""
    return tag + _varint(len(value)) + value if value else b""


def _written(reply: InferReply) -> tuple[bytes, bytes]:
    head = _field(b"\x0a", reply.model.encode()) + _field(b"\x12", reply.version.encode())
    outputs = []
    for t in reply.outputs:
        shape = b"".join([_varint(d) for d in t.shape])
        name, datatype = _field(b"\x0a", t.name.encode()), _field(b"\x12", t.datatype.encode())
        entry = name + datatype + _field(b"\x1a", shape)
        outputs.append(b"\x2a" + _varint(len(entry)) + entry)
    return head, b"".join(outputs)


def response_bytes(reply: InferReply, written: Written) -> bytes | None:
    """The serialized response for ``reply`` (``written``: the kinds of reply seen, added to); None when the
    reply has parameters of its own, a negative dim, or a text that is not Unicode: the message's."""
    if reply.parameters:
        return None
    outs = reply.outputs
    key = (reply.model, reply.version, *[t[:3] for t in outs])
    try:
        found = written.get(key)
    except TypeError:  # a shape that is not a tuple: the message's
        return None
    if found is None:
        for t in outs:
            if any(d < 0 for d in t.shape):
                return None
        try:
            parts = _written(reply)
        except UnicodeEncodeError:
            return None
        if len(written) >= MAX_KINDS:
            written.clear()
        found = written[key] = parts
    head, outputs = found
    pieces = [head]
    if reply.request_id:
        try:
            pieces.append(_field(b"\x1a", reply.request_id.encode()))
        except UnicodeEncodeError:
            return None
    pieces.append(outputs)
    for t in outs:
        data = wire_bytes(t.data) if t.datatype == dtypes.BYTES else t.data.tobytes()
        pieces += (b"\x32", _varint(len(data)), data)
    return b"".join(pieces)
