"""BUNDLE framing: several messages in one, each with its own command, header and inline frames."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zinfer.client import protocol
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import Command

_entries = st.lists(
    st.tuples(
        st.sampled_from(sorted(protocol.CLIENT_COMMANDS - {Command.BUNDLE})),
        st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3),
        st.lists(st.binary(max_size=8), max_size=3),
    ),
    min_size=1,
    max_size=20,
)


@given(_entries)
def test_round_trip_keeps_each_message_and_its_frames(
    entries: list[tuple[Command, dict[str, int], list[bytes]]],
) -> None:
    frames = protocol.encode_bundle(entries)
    assert protocol.is_bundle(frames)
    out = protocol.decode_many(frames, protocol.CLIENT_COMMANDS)
    assert [(m.command, m.header, [bytes(f) for f in m.frames]) for m in out] == entries


def test_a_plain_message_decodes_as_one() -> None:
    frames = protocol.encode(Command.SERVER_LIVE, {"id": "a"}, [b"x"])
    assert not protocol.is_bundle(frames)
    (m,) = protocol.decode_many(frames)
    assert (m.command, m.header, m.frames) == (Command.SERVER_LIVE, {"id": "a"}, [b"x"])


@pytest.mark.parametrize(
    "index, extra, why",
    [
        ([[int(Command.INFER), {}, 1]], [], "frames the message does not have"),
        ([[int(Command.INFER), {}, 0]], [b"x"], "frames no entry names"),
        ([[int(Command.BUNDLE), {}, 0]], [], "unknown command"),
        ([[0x7F, {}, 0]], [], "unknown command"),
        ([[int(Command.REPLY), {}, 0]], [], "not accepted here"),
        ([[int(Command.INFER), [], 0]], [], "header must be a map"),
        ([[int(Command.INFER), {}, -1]], [], "frames the message does not have"),
        ([[int(Command.INFER), {}]], [], "entry is"),
        ([], [], "1 to"),
        ([[int(Command.SERVER_LIVE), {}, 0]] * (protocol.MAX_BUNDLE + 1), [], "1 to"),
    ],
)
def test_malformed_bundles_raise_protocol_error(index: object, extra: list[bytes], why: str) -> None:
    frames = [protocol.PROTOCOL + bytes([Command.BUNDLE]) + msgpack.packb(index), *extra]
    with pytest.raises(ProtocolError, match=why):
        protocol.decode_many(frames, protocol.CLIENT_COMMANDS)
