"""Packed frames: small inline frames of one message carried as one blob, large ones as they are."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zinfer.client import framing, protocol
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import Command

BIG = framing.COPY_THRESHOLD


_frames = st.one_of(st.binary(max_size=16), st.sampled_from([b"L" * BIG, b"M" * (BIG + 3)]))


@given(st.lists(_frames, max_size=8))
def test_round_trip_keeps_every_frame_in_order(frames: list[bytes]) -> None:
    wire = protocol.encode(Command.REPLY, {"id": "r"}, frames)
    packed = bool(wire[0][4] & framing.PACKED)
    assert packed == (sum(len(f) < BIG for f in frames) >= 2)
    if packed:  # the small ones travel as one frame, the large ones as their own
        assert len(wire) == 2 + sum(len(f) >= BIG for f in frames)
    msg = protocol.decode(wire)
    assert (msg.command, msg.header) == (Command.REPLY, {"id": "r"})
    assert [bytes(f) for f in msg.frames] == frames


def test_a_packed_bundle_keeps_each_entry_s_frames() -> None:
    entries = [(Command.INFER, {"id": str(i)}, [bytes([i]) * 4, bytes([i]) * 8]) for i in range(100)]
    wire = protocol.encode_bundle(entries)
    assert len(wire) == 2 and protocol.is_bundle(wire)
    out = protocol.decode_many(wire, protocol.CLIENT_COMMANDS)
    assert [(m.command, m.header, [bytes(f) for f in m.frames]) for m in out] == entries


_PACKED_REPLY = protocol.PROTOCOL + bytes([Command.REPLY | framing.PACKED])


def _packed(refs: object, blob: bytes, *large: bytes, header: object = None) -> list[bytes]:
    top = msgpack.packb([refs, {"id": "x"} if header is None else header])
    return [_PACKED_REPLY + top, blob, *large]


@pytest.mark.parametrize(
    "frames, why",
    [
        (_packed([[0, 5]], b"abc"), "past the end"),
        (_packed([[-1, 1]], b"abc"), "non-negative"),
        (_packed([[0, True]], b"abc"), "non-negative"),
        (_packed([[0]], b"abc"), "a ref is"),
        (_packed([1], b"", b"x", b"y"), "named once each"),
        (_packed([0, 0], b"", b"x"), "named once each"),
        (_packed([], b"", b"x"), "no ref names"),
        (_packed({"a": 1}, b""), "refs must be a list"),
        (_packed([[0, 0]] * (protocol.MAX_TENSORS + 1), b""), "refs must be a list"),
        (_packed([[0, 1]], b"a", header=[1]), "header must be a map"),
        ([_PACKED_REPLY + msgpack.packb({"id": "x"})], "blob"),
        ([_PACKED_REPLY + msgpack.packb([1]), b""], "refs, head"),
    ],
)
def test_malformed_packed_messages_raise_protocol_error(frames: list[bytes], why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        protocol.decode(frames)
