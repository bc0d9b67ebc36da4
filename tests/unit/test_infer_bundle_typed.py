"""A BUNDLE of INFERs read in C (``protocol.decode_infer_bundle``, what the broker tries first for a bundle):
what it takes, the general path (``decode_many``, then ``infer_from_wire`` for each entry, as admission
reads it) takes too and reads as the same records and frames; anything else it leaves to that path (None),
which refuses it, or an entry of it, in its own words."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import framing, protocol
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import Command

INFER = {
    "id": "7-ab-1",
    "model": "add",
    "version": 0,
    "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [1, 16], "frame": 0},
        {"name": "B", "datatype": "FP32", "shape": [1, 16], "frame": 1},
    ],
}
WITH_SHM = {
    **INFER,
    "inputs": [{"name": "B", "datatype": "FP32", "shape": [1, 1], "shm": ["zinfer-c1", 64, 4]}],
    "outputs": [{"name": "SUM"}],
    "parameters": {"k": "v", "n": 1, "f": 0.5, "b": True},
    "priority": 1,
    "timeout_us": 5000,
    "caller_id": "mine",
}


def _bundle(entries: list[tuple[int, Any, list[bytes]]]) -> list[Any]:
    """A BUNDLE of ``(command, header, frames)`` with each header packed as msgpack writes it (so it may
    hold anything), its inline frames packed into one blob as ``encode_bundle`` packs them."""
    frames = [f for _, _, fs in entries for f in fs]
    wire = protocol.encode_bundle([(Command.INFER, {}, fs) for _, _, fs in entries])
    index = [[c, h, len(fs)] for c, h, fs in entries]
    if wire[0][4] & framing.PACKED:
        top = msgpack.unpackb(wire[0][5:], strict_map_key=False)
        return [wire[0][:5] + msgpack.packb([top[0], index]), *wire[1:]]
    return [wire[0][:5] + msgpack.packb(index), *frames]


def _general(wire: list[Any]) -> Any:
    """Each entry's record (or its error text) and frames as the general path reads them, or the whole
    bundle's error text."""
    try:
        messages = protocol.decode_many(wire, protocol.CLIENT_COMMANDS)
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"
    out = []
    for m in messages:
        try:
            record: Any = protocol.infer_from_wire(m.record_or_header)
        except ProtocolError as exc:
            record = f"ProtocolError: {exc}"
        out.append((m.command, record, [bytes(f) for f in m.frames]))
    return out


def _typed(wire: list[Any]) -> Any:
    messages = protocol.decode_infer_bundle(wire)
    if messages is None:
        return None
    for m in messages:
        assert m.header == {} and protocol.infer_from_wire(m.record_or_header) is m.record
    return [(m.command, m.record, [bytes(f) for f in m.frames]) for m in messages]


A, B = b"\0" * 64, b"\1" * 64


@pytest.mark.parametrize(
    "entries",
    [
        [(int(Command.INFER), {**INFER, "id": f"r{i}"}, [A, B]) for i in range(16)],
        [(int(Command.INFER), INFER, [A, B])],  # a bundle of one
        [(int(Command.INFER), WITH_SHM, []), (int(Command.INFER), INFER, [A, B])],
        [(int(Command.INFER), INFER, [b"x" * framing.COPY_THRESHOLD, B])],  # a large frame of its own
        [(int(Command.INFER), {**INFER, "id": f"r{i}"}, [A, B]) for i in range(protocol.MAX_BUNDLE)],
    ],
    ids=["sixteen", "one", "shm and options", "large frame", "the most a bundle holds"],
)
def test_a_bundle_of_infers_reads_as_the_general_path_reads_it(entries: list[Any]) -> None:
    wire = _bundle(entries)
    typed = _typed(wire)
    assert typed is not None  # the fast path is the one under test
    assert typed == _general(wire)
    assert [r.request_id for _, r, _ in typed] == [h["id"] for _, h, _ in entries]


def test_what_the_async_client_sends_is_read_typed() -> None:
    """The records the clients bundle (headers as ``InferRequest``s), as ``encode_bundle`` packs them."""
    items = []
    for i in range(8):
        rec = protocol.infer_from_wire({**INFER, "id": f"c{i}"})
        items.append((Command.INFER, rec, [A, B]))
    wire = [bytes(f) for f in protocol.encode_bundle(items)]
    assert _typed(wire) == _general(wire)
    assert [r for _, r, _ in _typed(wire)] == [rec for _, rec, _ in items]


BOTH = {"name": "A", "datatype": "FP32", "shape": [1], "frame": 0, "shm": ["s", 0, 4]}
BAD_TENSOR = {**INFER, "inputs": [BOTH]}
MALFORMED = [
    ("another command in it", [(int(Command.INFER), INFER, [A, B]),
                               (int(Command.SERVER_LIVE), {"id": "x"}, [])]),
    ("a bundle inside", [(int(Command.BUNDLE), INFER, [A, B])]),
    ("an unknown command", [(0x7F, INFER, [A, B])]),
    ("a tensor naming both a frame and shm", [(int(Command.INFER), BAD_TENSOR, [A])]),
    ("a parameter holding a list", [(int(Command.INFER), {**INFER, "parameters": {"p": [1]}}, [A, B])]),
    ("an unknown key", [(int(Command.INFER), {**INFER, "zz": 1}, [A, B])]),
    ("a wrong type", [(int(Command.INFER), {**INFER, "version": True}, [A, B])]),
    ("a missing id", [(int(Command.INFER), {k: v for k, v in INFER.items() if k != "id"}, [A, B])]),
    ("a good entry, then a bad one", [(int(Command.INFER), INFER, [A, B]),
                                      (int(Command.INFER), {**INFER, "model": ""}, [A, B])]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "entries"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_what_the_typed_path_does_not_take_is_left_to_the_general_path(what: str, entries: list[Any]) -> None:
    wire = _bundle(entries)
    assert protocol.decode_infer_bundle(wire) is None
    _general(wire)  # reads it, or refuses it (or an entry) by name: never raises anything else


@pytest.mark.parametrize(
    ("index", "extra", "why"),
    [
        ([[int(Command.INFER), INFER, 3]], [A, B], "frames the message does not have"),
        ([[int(Command.INFER), INFER, 1]], [A, B], "frames no entry names"),
        ([[int(Command.INFER), INFER, True]], [A, B], "frames the message does not have"),
        ([[True, INFER, 2]], [A, B], "unknown command"),
        ([[int(Command.INFER), INFER]], [A, B], r"\[command, header, frames\]"),
        ([[int(Command.INFER), [1, 2], 0]], [], "header must be a map"),
        ([], [], "1 to"),
        ([[int(Command.INFER), INFER, 0]] * (protocol.MAX_BUNDLE + 1), [], "1 to"),
    ],
)
def test_malformed_bundles_are_refused_with_the_general_path_s_words(
    index: list[Any], extra: list[bytes], why: str
) -> None:
    wire = [protocol.PROTOCOL + bytes([Command.BUNDLE]) + msgpack.packb(index), *extra]
    assert protocol.decode_infer_bundle(wire) is None
    with pytest.raises(ProtocolError, match=why):
        protocol.decode_many(wire, protocol.CLIENT_COMMANDS)


def test_broken_envelopes_and_other_messages_are_not_read_as_a_bundle() -> None:
    good = _bundle([(int(Command.INFER), INFER, [A, B])])
    assert protocol.decode_infer_bundle([]) is None
    assert protocol.decode_infer_bundle([good[0]]) is None  # packed without its blob
    assert protocol.decode_infer_bundle([good[0] + b"\x00", *good[1:]]) is None  # bytes after the header
    assert protocol.decode_infer_bundle(protocol.encode(Command.INFER, INFER, [A, B])) is None  # a lone one
    deep = b"\x91" * 200_000 + b"\x01"
    nested = b"\x91\x93" + bytes([Command.INFER]) + b"\x81\xa2id" + deep + b"\x00"
    assert protocol.decode_infer_bundle([protocol.PROTOCOL + bytes([Command.BUNDLE]) + nested]) is None


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
_KEYS = ["id", "model", "version", "inputs", "outputs", "parameters", "priority", "timeout_us", "caller_id",
         "x"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(_KEYS),
    value=_VALUES,
    which=st.integers(0, 2),
    command=st.sampled_from([int(Command.INFER), int(Command.INFER), int(Command.SERVER_LIVE), True, 0]),
    count=st.integers(0, 3),
)
def test_the_typed_path_never_takes_what_the_general_path_refuses_or_reads_it_otherwise(
    key: str, value: Any, which: int, command: Any, count: int
) -> None:
    entries: list[Any] = [[int(Command.INFER), {**INFER, "id": f"r{i}"}, [A, B]] for i in range(3)]
    entries[which][1] = {**entries[which][1], key: value}
    entries[which][0] = command
    wire = _bundle([(c, h, fs) for c, h, fs in entries])
    if count != 2:  # an entry that names more or fewer frames than it brings
        top = msgpack.unpackb(wire[0][5:], strict_map_key=False)
        top[1][which][2] = count
        wire = [wire[0][:5] + msgpack.packb(top), *wire[1:]]
    typed = _typed(wire)
    if typed is not None:
        assert typed == _general(wire)
