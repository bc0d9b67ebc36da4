"""A BUNDLE of REPLYs read in C (``protocol._typed_reply_bundle``) reads as the general path does, and
refuses, with the general path's words, what that path refuses; headers nested past msgspec's depth are
refused by name, never with a ``RecursionError``."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from zinfer.client import framing, protocol
from zinfer.client.errors import ProtocolError, Status
from zinfer.client.protocol import Command

_BODY = {"model": "add0", "version": 1,
         "outputs": [{"name": "OUTPUT_SUM", "datatype": "FP32", "shape": [1, 1], "frame": 0}]}  # fmt: skip


def _general(frames: list[Any]) -> list[tuple[protocol.Reply, list[bytes]]]:
    return [(protocol.reply_from_wire(m.header), [bytes(f) for f in m.frames])
            for m in protocol.decode_many(frames, frozenset({Command.REPLY}))]  # fmt: skip


def _read(frames: list[Any]) -> list[tuple[protocol.Reply, list[bytes]]]:
    return [(r, [bytes(f) for f in fs]) for r, fs in protocol.decode_replies(frames)]


@pytest.mark.parametrize("inline", [[b"ab"], [b"ab", b"cd"], [b"x" * framing.COPY_THRESHOLD], []])
def test_a_reply_bundle_reads_as_the_general_path_reads_it(inline: list[bytes]) -> None:
    items = [(Command.REPLY, {"id": f"r{i}", "status": 0, "body": _BODY}, inline) for i in range(16)]
    items.append((Command.REPLY, {"id": "e", "status": int(Status.NOT_FOUND), "error": "NotFound: m"}, []))
    frames = [bytes(memoryview(f)) for f in protocol.encode_bundle(items)]
    assert protocol._typed_reply_bundle(frames) is not None  # the fast path is the one under test
    assert _read(frames) == _general(frames)
    assert _read(frames)[-1][0].status == Status.NOT_FOUND


@pytest.mark.parametrize(
    "body",
    [
        {"k": b"bytes"},  # msgspec's union takes no bytes beside str
        {str(i): i for i in range((1 << 12) + 1)},  # over msgpack's map cap: the general path refuses
        [[[[[[[[1]]]]]]]],  # deeper than the typed body
        {1: "int key"},
    ],
)
def test_what_the_typed_path_does_not_take_is_read_or_refused_as_before(body: Any) -> None:
    items = [(Command.REPLY, {"id": "a", "status": 0, "body": body}, []),
             (Command.REPLY, {"id": "b", "status": 0}, [])]  # fmt: skip
    frames = protocol.encode_bundle(items) if not isinstance(body, dict) or 1 not in body else None
    if frames is None:  # msgpack packs int keys; the general path refuses them (strict_map_key)
        index = [[int(Command.REPLY), h, 0] for _, h, _ in items]
        frames = [protocol.PROTOCOL + bytes([Command.BUNDLE]) + msgpack.packb(index)]
    assert protocol._typed_reply_bundle(frames) is None
    try:
        expected: Any = _general(frames)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError, match=str(exc)):
            protocol.decode_replies(frames)
    else:
        assert _read(frames) == expected


def test_an_unknown_status_in_a_bundle_is_read_as_internal() -> None:
    items = [(Command.REPLY, {"id": "a", "status": 77}, []), (Command.REPLY, {"id": "b", "status": 0}, [])]
    replies = protocol.decode_replies(protocol.encode_bundle(items))
    assert [r.status for r, _ in replies] == [Status.INTERNAL, Status.OK]


@pytest.mark.parametrize(
    "index, extra, why",
    [
        ([[int(Command.REPLY), {"id": "a", "status": 0}, 1]], [], "frames the message does not have"),
        ([[int(Command.REPLY), {"id": "a", "status": 0}, 0]], [b"x"], "frames no entry names"),
        ([[int(Command.INFER), {"id": "a", "status": 0}, 0]], [], "not accepted here"),
        ([[int(Command.REPLY), {"id": "a", "status": 0}, True]], [], "frames the message does not have"),
        ([[int(Command.REPLY), {"status": 0}, 0]], [], "missing field 'id'"),
        ([], [], "1 to"),
    ],
)
def test_malformed_reply_bundles_raise_the_general_path_s_errors(
    index: object, extra: list[bytes], why: str
) -> None:
    frames = [protocol.PROTOCOL + bytes([Command.BUNDLE]) + msgpack.packb(index), *extra]
    with pytest.raises(ProtocolError, match=why):
        protocol.decode_replies(frames)


_DEEP = b"\x91" * 200_000 + b"\x01"


def test_a_deeply_nested_reply_bundle_is_refused_by_name() -> None:
    index = b"\x91\x93" + bytes([Command.REPLY]) + b"\x83\xa2id\xa1a\xa6status\x00\xa4body" + _DEEP + b"\x00"
    with pytest.raises(ProtocolError, match="malformed header"):
        protocol.decode_replies([protocol.PROTOCOL + bytes([Command.BUNDLE]) + index])


def test_a_deeply_nested_infer_is_refused_by_name_not_with_recursion_error() -> None:
    header = b"\x85\xa2id\xa1a\xa5model\xa1m\xa7version\x00\xa6inputs\x90\xaaparameters\x81\xa1p" + _DEEP
    frames = [protocol.PROTOCOL + bytes([Command.INFER]) + header]
    assert protocol.decode_infer(frames) is None  # was: RecursionError out of msgspec
    with pytest.raises(ProtocolError, match="malformed header"):
        protocol.decode(frames)


@pytest.mark.parametrize(
    "refs, why",
    [([[0, 5]], "past the end"), ([[-1, 1]], "non-negative"), ([[True, 1]], "non-negative"),
     ([[0, 1.0]], "non-negative"), ([[0, 1, 2]], "a ref is")],
)  # fmt: skip
def test_the_framing_fast_path_leaves_bad_refs_to_the_checks(refs: list[Any], why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        framing.unpack(refs, b"abc", [], protocol.MAX_TENSORS)
    assert [bytes(f) for f in framing.unpack([[1, 2], [0, 0]], b"abc", [], 4)] == [b"bc", b""]


@pytest.mark.parametrize(
    "header",
    [
        {"id": "a", "status": 0, "body": _BODY},
        {"id": "a", "status": int(Status.NOT_FOUND), "error": "NotFound: m"},
        {"id": "a", "status": 77},  # an unknown status: read as INTERNAL
        {"id": "a", "status": 0, "body": {"k": b"bytes"}},
        {"id": "a", "status": 0, "body": {str(i): i for i in range((1 << 12) + 1)}},  # over the map cap
        {"id": "a", "status": 0, "body": [[[[[[[[1]]]]]]]]},
        {"id": "a", "status": 0, "extra": 1},
        {"status": 0},
        {"id": 5, "status": 0},
        {"id": "a", "status": True},
    ],
)
def test_a_lone_reply_reads_as_the_map_path_reads_it(header: dict[str, Any]) -> None:
    frames = protocol.encode(Command.REPLY, header, [b"ab"])
    try:
        expected = protocol.reply_from_wire(protocol.decode(frames).header)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError, match=str(exc)):
            protocol.decode_replies(frames)
        return
    [(reply, inline)] = protocol.decode_replies(frames)
    assert reply == expected and [bytes(f) for f in inline] == [b"ab"]
    if header.get("status") == 77:
        assert reply.status == Status.INTERNAL


def test_a_deeply_nested_lone_reply_is_refused_by_name() -> None:
    head = b"\x83\xa2id\xa1a\xa6status\x00\xa4body" + _DEEP
    with pytest.raises(ProtocolError, match="malformed header"):
        protocol.decode_replies([protocol.PROTOCOL + bytes([Command.REPLY]) + head])
