"""The one-frame envelope and the typed wire records (``client/wire_records.py``): every record survives a
round trip through the envelope, whether written as a map or encoded straight from its Struct; malformed,
oversized and wrong-typed envelopes and fields are refused with the same clear errors as the field-by-field
checks, and what the Struct takes is never more than those checks take."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from zinfer.client import framing, protocol
from zinfer.client.errors import ProtocolError, Status
from zinfer.client.protocol import Command, InferRequest, OutputRequest, Reply, ShmRef, TensorRef

SHM = ShmRef("zinfer-c1-abcd", 64, 16)
REQUEST = InferRequest(
    "r1",
    "add",
    3,
    (TensorRef("A", "FP32", (4, 1), shm=SHM), TensorRef("B", "FP32", (4, 1), frame=0)),
    (OutputRequest("SUM", SHM), OutputRequest("DIFF")),
    priority=2,
    timeout_us=5000,
    parameters={"k": "v", "n": 1},
    caller_id="mine",
)


@pytest.mark.parametrize("command", list(Command))
def test_every_command_travels_in_one_envelope_frame(command: Command) -> None:
    wire = protocol.encode(command, {"id": "x"}, [b"\0" * 4])
    assert len(wire) == 2 and bytes(wire[0][:5]) == protocol.PROTOCOL + bytes([command])
    msg = protocol.decode(wire)
    assert (msg.command, msg.header, [bytes(f) for f in msg.frames]) == (command, {"id": "x"}, [b"\0" * 4])


def test_packed_inline_frames_still_follow_one_envelope() -> None:
    wire = protocol.encode(Command.INFER, {"id": "x"}, [b"a", b"bb", b"ccc"])
    assert len(wire) == 2 and wire[0][4] & framing.PACKED  # the envelope, then one blob
    assert [bytes(f) for f in protocol.decode(wire).frames] == [b"a", b"bb", b"ccc"]


def test_infer_request_round_trips_as_a_map_and_as_its_struct() -> None:
    as_map = protocol.decode(protocol.encode(Command.INFER, protocol.infer_to_wire(REQUEST), [b"\0" * 16]))
    assert protocol.infer_from_wire(as_map.header) == REQUEST
    as_struct = protocol.decode(protocol.encode(Command.INFER, REQUEST))  # type: ignore[arg-type]
    assert as_struct.header == protocol.infer_to_wire(REQUEST)  # the same map: field names, defaults left out
    assert protocol.infer_from_wire(as_struct.header) == REQUEST


@pytest.mark.parametrize(
    "reply",
    [
        Reply("x", Status.OK),
        Reply("x", Status.OK, body={"final": False, "n": [1, 2]}),
        Reply("y", Status.NOT_FOUND, "NotFound: unknown model 'nope'"),
    ],
)
def test_reply_round_trips(reply: Reply) -> None:
    msg = protocol.decode(protocol.encode(Command.REPLY, protocol.reply_to_wire(reply)))
    got = protocol.reply_from_wire(msg.header)
    assert got == reply and got.status is reply.status


def test_an_unknown_status_is_read_as_internal() -> None:
    assert protocol.reply_from_wire({"id": "x", "status": 200}).status is Status.INTERNAL


def test_records_are_immutable_and_replaceable() -> None:
    with pytest.raises(AttributeError):
        REQUEST.model = "other"  # type: ignore[misc]
    assert REQUEST._replace(model="other").model == "other" and REQUEST.model == "add"
    assert SHM == ("zinfer-c1-abcd", 64, 16)  # a reference is still a tuple


def _tensor(**over: Any) -> dict[str, Any]:
    return {"name": "A", "datatype": "FP32", "shape": [1], "frame": 0, **over}


def _infer(**over: Any) -> dict[str, Any]:
    return {"id": "r", "model": "m", "version": 0, "inputs": [_tensor()], **over}


@pytest.mark.parametrize(
    "header, message",
    [
        (_infer(outputs=None), "'outputs' must be list"),  # absent is every output; null is not absent
        (_infer(inputs=[_tensor(shm=None)]), "shared-memory reference"),
        (_infer(inputs=[_tensor(frame=None, shm=["r", 0, 4])]), "'frame' must be int"),
        (_infer(outputs=[{"name": "O", "slot": None}]), "shared-memory reference"),
        (_infer(model="m" * 257), "'model' must be 1 to 256"),
        (_infer(inputs=[_tensor(name="n" * 257)]), "'name' must be 1 to 256"),
        (_infer(inputs=[_tensor(frame=protocol.MAX_TENSORS + 1)]), "'frame' out of range"),
        (_infer(inputs=[_tensor(shape=[2**40])]), "shape dims"),
        (_infer(inputs=[_tensor(shape=[True])]), "shape dims"),
        (_infer(inputs=[_tensor()] * (protocol.MAX_TENSORS + 1)), "more than 256"),
        (_infer(priority=2**63), "'priority' out of range"),
        (_infer(timeout_us=1.5), "'timeout_us' must be int"),
        (_infer(version="1"), "'version' must be int"),
        (_infer(id=None), "'id' must be str"),
        (_infer(parameters=[1]), "'parameters' must be dict"),
        (_infer(caller_id=3), "'caller_id' must be str"),
        (_infer(inputs=[_tensor(shm=["", 0, 4], frame=None)]), "region name"),
        (_infer(inputs=[_tensor(shm=["r", 0, 2**63], frame=None)]), "offset and nbytes"),
    ],
)
def test_what_the_struct_refuses_gets_the_field_by_field_error(header: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.infer_from_wire(header)


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "no frames"),
        ([b"ZNF1"], "older shape"),
        ([b"ZNF1", b"\x01", msgpack.packb({"id": "x"})], "older shape"),
        ([b"ZNF1\x01"], "no header"),
        ([b"ZNF9\x01" + msgpack.packb({})], "unknown protocol"),
        ([b"ZNF1\x01" + msgpack.packb({"id": "x"})[:-1]], "malformed header"),  # truncated
        ([b"ZNF1\x01" + msgpack.packb("text")], "must be a map"),
        ([b"ZNF1\x01" + msgpack.packb({"id": "x" * protocol.MAX_HEADER_BYTES})], "over the"),
        ([b"ZNF1\x01" + msgpack.packb({}), *[b""] * (protocol.MAX_TENSORS + 1)], "too many inline frames"),
        ([b"ZNF1\x81" + msgpack.packb([[], {}])], "a blob frame"),
    ],
)
def test_malformed_envelopes_are_refused_clearly(frames: list[bytes], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.decode(frames)


def test_subclasses_of_plain_types_encode_as_msgpack_always_took_them() -> None:
    """A model name that is a str subclass (BLS with a NumPy string, a user's enum) encodes as its base type,
    byte for byte what msgpack wrote; what msgpack refused is still refused."""

    class Name(str):
        pass

    class Table(dict[str, Any]):
        pass

    header = {"model": Name("add"), "parameters": Table(n=Status.OK), "ids": (Name("a"), 2)}
    wire = protocol.encode(Command.INFER, header)
    assert bytes(wire[0][5:]) == msgpack.packb(header, use_bin_type=True)
    assert protocol.decode(wire).header == {"model": "add", "parameters": {"n": 0}, "ids": ["a", 2]}
    with pytest.raises(TypeError):
        protocol.encode(Command.INFER, {"x": object()})
