"""Headers read straight from their bytes into their records (``protocol.decode_typed``: a lone INFER in the
broker, EXECUTE in the worker, RESULT in the broker). What that path takes, the map path (``decode`` and the
record's ``*_from_wire``) takes too and reads as the same record; anything else it leaves to the map path
(None), which names the fault in its own words: unknown keys, msgpack's container caps, ext values,
containers in an INFER's parameters, wrong types, bounds."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import protocol, worker_protocol
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import Command

INFER = {
    "id": "7-ab-1",
    "model": "add",
    "version": 0,
    "inputs": [
        {"name": "A", "datatype": "FP32", "shape": [1, 1], "frame": 0},
        {"name": "B", "datatype": "FP32", "shape": [1, 1], "shm": ["zinfer-c1", 64, 4]},
    ],
    "outputs": [{"name": "SUM"}],
    "parameters": {"k": "v", "n": 1, "f": 0.5, "b": True},
}
EXECUTE = {
    "batch": 9,
    "requests": [
        {
            "id": 1,
            "inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 1], "frame": 0}],
            "outputs": [{"name": "SUM"}],
            "request_id": "mine",
            "sequence": {"id": 5, "start": True, "end": False, "controls": []},
            "parameters": {"k": 1},
        }
    ],
    "regions": {"zinfer-c1": [7, 2049, 123456]},
}
RESULT = {
    "batch": 9,
    "results": [
        {"id": 1, "status": 0, "outputs": [{"name": "SUM", "datatype": "FP32", "shape": [1], "frame": 0}]}
    ],
    "t": [10, 20, 30],
}
CASES = [
    (Command.INFER, INFER, protocol.decode_infer, protocol.infer_from_wire),
    (Command.W_EXECUTE, EXECUTE, worker_protocol.decode_execute, worker_protocol.execute_from_wire),
    (Command.W_RESULT, RESULT, worker_protocol.decode_result, worker_protocol.result_from_wire),
]


def _wire(command: Command, header: Any, frames: list[bytes]) -> list[Any]:
    """The message's frames, with the header packed as msgpack itself writes it (so it may hold anything)."""
    wire = protocol.encode(command, {}, frames)
    packed = wire[0][4] & 0x80
    if packed:
        top = msgpack.unpackb(wire[0][5:], strict_map_key=False)
        return [wire[0][:5] + msgpack.packb([top[0], header]), *wire[1:]]
    return [wire[0][:5] + msgpack.packb(header), *wire[1:]]


def _map_path(command: Command, wire: list[Any], from_wire: Any) -> Any:
    """The record the map path reads, or its error text."""
    try:
        return from_wire(protocol.decode(wire).header)
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


@pytest.mark.parametrize(("command", "header", "typed", "from_wire"), CASES)
@pytest.mark.parametrize("frames", [[b"\0" * 4], [b"\0" * 4, b"\1" * 4]], ids=["plain", "packed"])
def test_a_well_formed_header_is_read_straight_into_the_record_the_map_path_reads(
    command: Command, header: dict[str, Any], typed: Any, from_wire: Any, frames: list[bytes]
) -> None:
    wire = _wire(command, header, frames)
    msg = typed(wire)
    assert msg is not None and msg.command == command and msg.header == {}
    assert msg.record == _map_path(command, wire, from_wire)
    assert from_wire(msg.record_or_header) is msg.record
    assert [bytes(f) for f in msg.frames] == frames


HOSTILE = [
    ("unknown key holding a list over msgpack's cap", {"junk": [0] * 70_000}),
    ("unknown key holding an ext value", {"junk": msgpack.ExtType(1, b"x")}),
    ("unknown key holding a map with an int key", {"junk": {1: 2}}),
    ("an unknown key at all", {"zz": 1}),
]


@pytest.mark.parametrize(("command", "header", "typed", "from_wire"), CASES)
@pytest.mark.parametrize(("what", "extra"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_what_only_the_map_path_bounds_is_left_to_it(
    command: Command, header: dict[str, Any], typed: Any, from_wire: Any, what: str, extra: dict[str, Any]
) -> None:
    wire = _wire(command, {**header, **extra}, [b"\0" * 4])
    assert typed(wire) is None  # the map path reads it: its caps refuse it, or it ignores the key
    if what != "an unknown key at all":
        assert _map_path(command, wire, from_wire) == "ProtocolError: malformed header: ValueError"


@pytest.mark.parametrize(
    "params",
    [{"nested": [1, 2]}, {"nested": {"a": 1}}, {"big": [0] * 70_000}, {"ext": msgpack.ExtType(1, b"x")}],
    ids=["list", "map", "over the cap", "ext"],
)
def test_an_infer_whose_parameters_hold_containers_goes_through_the_map(params: dict[str, Any]) -> None:
    wire = _wire(Command.INFER, {**INFER, "parameters": params}, [b"\0" * 4])
    assert protocol.decode_infer(wire) is None


WRONG = [
    (Command.INFER, {**INFER, "version": True}, "field 'version' must be int"),
    (Command.INFER, {**INFER, "model": "m" * 257}, "field 'model' must be 1 to 256 characters"),
    (Command.W_RESULT, {**RESULT, "t": [1, 2]}, "field 't' must be three durations in nanoseconds"),
    (Command.W_EXECUTE, {**EXECUTE, "regions": {"r": [1, 2]}}, "a region must be named by [fd, dev, ino]"),
]


@pytest.mark.parametrize(("command", "header", "error"), WRONG)
def test_a_wrong_field_is_named_by_the_map_path(command: Command, header: dict[str, Any], error: str) -> None:
    typed, from_wire = next((c[2], c[3]) for c in CASES if c[0] == command)
    wire = _wire(command, header, [b"\0" * 4])
    assert typed(wire) is None
    assert error in _map_path(command, wire, from_wire)


def test_other_messages_and_broken_envelopes_are_not_read_typed() -> None:
    assert protocol.decode_infer(protocol.encode(Command.SERVER_LIVE, {"id": "x"})) is None
    assert worker_protocol.decode_result(_wire(Command.INFER, INFER, [])) is None
    assert protocol.decode_infer([]) is None
    assert protocol.decode_infer([b"ZNF1"]) is None
    good = _wire(Command.INFER, INFER, [b"a", b"b"])
    assert protocol.decode_infer([good[0]]) is None  # packed without its blob
    assert protocol.decode_infer([good[0] + b"\x00", good[1]]) is None  # trailing bytes after the header


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    case=st.sampled_from(CASES),
    key=st.sampled_from(["id", "model", "version", "inputs", "outputs", "parameters", "batch", "requests",
                         "results", "t", "regions", "serial", "partial", "priority", "timeout_us", "x"]),
    value=_VALUES,
    packed=st.booleans(),
)  # fmt: skip
def test_the_typed_path_never_takes_what_the_map_path_refuses_or_reads_it_otherwise(
    case: Any, key: str, value: Any, packed: bool
) -> None:
    command, header, typed, from_wire = case
    wire = _wire(command, {**header, key: value}, [b"\0" * 4, b"\1"] if packed else [b"\0" * 4])
    msg = typed(wire)
    if msg is not None:
        assert msg.record == _map_path(command, wire, from_wire)
