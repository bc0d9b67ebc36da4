from __future__ import annotations

import msgpack
import pytest

from zinfer.client import protocol
from zinfer.client.errors import (
    InvalidArgument,
    NotFound,
    ProtocolError,
    ServerError,
    Status,
    Unavailable,
    from_status,
)
from zinfer.client.protocol import Command, InferRequest, OutputRequest, Reply, ShmRef, TensorRef


def test_infer_request_round_trip() -> None:
    req = InferRequest(
        request_id="r1",
        model="add",
        version=2,
        inputs=(
            TensorRef("A", "FP32", (4, 1), shm=ShmRef("zinfer-c1-abcd", 128, 16)),
            TensorRef("B", "FP32", (4, 1), frame=0),
        ),
        outputs=(OutputRequest("SUM", ShmRef("zinfer-c1-abcd", 256, 16)), OutputRequest("DIFF")),
        priority=1,
        timeout_us=5000,
        parameters={"k": "v"},
    )
    frames = protocol.encode(Command.INFER, protocol.infer_to_wire(req), [b"\0" * 16])
    msg = protocol.decode(frames)
    assert msg.command is Command.INFER
    assert len(msg.frames) == 1
    assert protocol.infer_from_wire(msg.header) == req


def test_outputs_absent_means_all() -> None:
    req = InferRequest("r", "m", 0, (TensorRef("A", "FP32", (1,), frame=0),))
    assert protocol.infer_from_wire(protocol.infer_to_wire(req)).outputs is None


def test_reply_round_trip() -> None:
    r = Reply("x", Status.NOT_FOUND, "NotFound: unknown model 'nope'", body={"a": 1})
    assert protocol.reply_from_wire(protocol.reply_to_wire(r)) == r


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "no frames"),
        ([b"ZNF1\x01"], "no header"),
        ([b"HTTP\x01" + msgpack.packb({})], "unknown protocol"),
        ([b"ZNF", b"\x01"], "unknown protocol"),
        ([b"ZNF1", b"\x01", msgpack.packb({})], "older shape"),
        ([b"ZNF1\x7f" + msgpack.packb({})], "unknown command"),
        ([b"ZNF1\x01" + b"\xc1"], "malformed header"),
        ([b"ZNF1\x01" + msgpack.packb([1, 2])], "must be a map"),
        ([b"ZNF1\x01" + b"\x00" * (protocol.MAX_HEADER_BYTES + 1)], "over the"),
        ([b"ZNF1\x01" + msgpack.packb({}) + b"extra"], "malformed header"),
        ([b"ZNF1\x01" + b"\x91" * 5000], "malformed header"),  # deep nesting
    ],
)
def test_decode_rejects(frames: list[bytes], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.decode(frames)


def test_decode_restricts_commands() -> None:
    frames = protocol.encode(Command.W_RESULT, {})
    with pytest.raises(ProtocolError, match="not accepted"):
        protocol.decode(frames, protocol.CLIENT_COMMANDS)


def test_no_pickle_extension_types() -> None:
    packed = msgpack.packb({"x": msgpack.ExtType(1, b"evil")})
    with pytest.raises(ProtocolError):
        protocol.decode([b"ZNF1\x01" + packed])


def _infer(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "r",
        "model": "m",
        "version": 0,
        "inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "frame": 0}],
    }
    base.update(over)
    return base


@pytest.mark.parametrize(
    "header, message",
    [
        (_infer(model=""), "'model' must be 1 to"),
        (_infer(model=5), "'model' must be str"),
        (_infer(version=-1), "'version' out of range"),
        (_infer(version=True), "'version' must be int"),
        (_infer(inputs="x"), "'inputs' must be list"),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1] * 17, "frame": 0}]), "more than 16"),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [-1], "frame": 0}]), "shape dims"),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1]}]), "exactly one"),
        (
            _infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1], "frame": 0, "shm": ["r", 0, 4]}]),
            "exactly one",
        ),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1], "shm": ["r", -8, 4]}]), "offset"),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1], "shm": ["r", 2**64, 4]}]), "offset"),
        (_infer(inputs=[{"name": "A", "datatype": "FP32", "shape": [1], "shm": ["r", 0]}]), "reference"),
        (_infer(inputs=[1]), "tensor must be a map"),
        (_infer(outputs=[{"slot": ["r", 0, 4]}]), "missing field 'name'"),
        ({"model": "m", "inputs": []}, "missing field 'id'"),
    ],
)
def test_infer_from_wire_rejects(header: dict[str, object], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        protocol.infer_from_wire(header)


@pytest.mark.parametrize("cls", [InvalidArgument, NotFound, Unavailable])
def test_error_text_round_trip(cls: type[ServerError]) -> None:
    exc = cls("something is off")
    back = from_status(exc.status, exc.wire_text())
    assert type(back) is cls
    assert str(back) == "something is off"


def test_unknown_status_is_internal() -> None:
    assert type(from_status(250, "x")).__name__ == "InternalError"
