"""Bad requests get the matching error, change nothing else, and the server keeps serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.conftest import ServerProcess
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.errors import InvalidArgument, NotFound
from zinfer.client.protocol import Command
from zinfer.client.shm import Segment

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


@pytest.fixture(scope="module")
def client(bundled_server: ServerProcess) -> Iterator[Client]:
    with Client(bundled_server.url, timeout=30, inline_threshold=-1) as c:  # every tensor through shm
        yield c


def _still_serving(client: Client) -> None:
    out = client.infer("add", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}).as_numpy("OUTPUT_SUM")
    assert out[0, 0] == 3.0


@pytest.mark.parametrize(
    "model, inputs, kwargs, error, message",
    [
        ("nope", {"X": ONE}, {}, NotFound, "Request for unknown model: 'nope' is not found"),
        (
            "add",
            {"INPUT_A": ONE},
            {"model_version": 7},
            NotFound,
            "Request for unknown model: 'add' version 7 is not found",
        ),
        (
            "add",
            {"INPUT_A": ONE},
            {},
            InvalidArgument,
            "expected 2 inputs but got 1 inputs for model 'add'. Got input(s) ['INPUT_A'], "
            "but missing required input(s) ['INPUT_B']",
        ),
        (
            "add",
            {"INPUT_A": ONE, "INPUT_B": ONE, "EXTRA": ONE},
            {},
            InvalidArgument,
            "unexpected inference input 'EXTRA' for model 'add'",
        ),
        (
            "add",
            {"INPUT_A": ONE.astype(np.float64), "INPUT_B": ONE},
            {},
            InvalidArgument,
            "inference input 'INPUT_A' data-type is 'FP64', but model 'add' expects 'FP32'",
        ),
        (
            "add",
            {"INPUT_A": np.ones((1, 2), np.float32), "INPUT_B": ONE},
            {},
            InvalidArgument,
            "unexpected shape for input 'INPUT_A' for model 'add'. Expected [-1,1], got [1,2]",
        ),
        (
            "add",
            {"INPUT_A": np.ones(1, np.float32), "INPUT_B": ONE},
            {},
            InvalidArgument,
            "unexpected shape for input 'INPUT_A'",
        ),
        (
            "add",
            {"INPUT_A": np.ones((17, 1), np.float32), "INPUT_B": np.ones((17, 1), np.float32)},
            {},
            InvalidArgument,
            "inference request batch-size must be <= 16 for 'add'",
        ),
        (
            "add",
            {"INPUT_A": np.ones((2, 1), np.float32), "INPUT_B": ONE},
            {},
            InvalidArgument,
            "batch size does not match other inputs",
        ),
        (
            "add",
            {"INPUT_A": ONE, "INPUT_B": ONE},
            {"outputs": ["NOPE"]},
            InvalidArgument,
            "unexpected inference output 'NOPE' for model 'add'",
        ),
        ("add", {"INPUT_A": np.array([[b"x"]], dtype=object), "INPUT_B": ONE}, {}, InvalidArgument, "BYTES"),
    ],
)
def test_bad_request_is_refused_and_server_keeps_serving(
    client: Client, model: str, inputs: dict[str, Any], kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error) as info:
        client.infer(model, inputs, **kwargs)
    assert message in str(info.value)
    _still_serving(client)


def test_inline_request_errors_too(bundled_server: ServerProcess) -> None:
    with Client(bundled_server.url, timeout=30, shm=False) as inline:
        with pytest.raises(InvalidArgument, match="data-type is 'INT32', but model 'add' expects 'FP32'"):
            inline.infer("add", {"INPUT_A": ONE.astype(np.int32), "INPUT_B": ONE})
        _still_serving(inline)


# --------------------------------------------------------------------------- raw messages on a socket


@pytest.fixture
def raw(bundled_server: ServerProcess) -> Iterator[Raw]:
    r = Raw(bundled_server.url)
    yield r
    r.close()


@pytest.fixture
def region(raw: Raw) -> Iterator[Segment]:
    seg = Segment.create_sealed(4096)
    try:
        assert raw.register(seg).status == protocol.Status.OK
        yield seg
        raw.call(Command.UNREGISTER, {"name": seg.name})
    finally:
        seg.close()  # also when registering or UNREGISTER fails or times out


@pytest.mark.parametrize(
    "frames, message",
    [
        ([b"ZNF1" + b"\x01" + b"\xc1\xc1"], "malformed header"),
        ([b"ZNF1" + b"\x01" + msgpack.packb([1, 2, 3])], "must be a map"),
        ([b"ZNF1" + b"\x7e" + msgpack.packb({})], "unknown command"),
        ([b"ZNF1" + bytes([Command.W_READY]) + msgpack.packb({})], "not accepted"),
        ([b"ZNF1\x01" + b"\xdd" + b"\xff" * 4 + b"\x00" * 8], "malformed header"),  # array of 2**32 items
        ([b"ZNF1" + b"\x01" + b"\x00" * (protocol.MAX_HEADER_BYTES + 10)], "over the"),
        # an INFER whose parameter nests past msgspec's depth (its decoder raised RecursionError)
        (
            [
                b"ZNF1"
                + bytes([Command.INFER])
                + b"\x85\xa2id\xa1a\xa5model\xa3add\xa7version\x00\xa6inputs\x90"
                b"\xaaparameters\x81\xa1p" + b"\x91" * 200_000 + b"\x01"
            ],
            "malformed header",
        ),
    ],
)
def test_malformed_messages_get_errors(client: Client, raw: Raw, frames: list[bytes], message: str) -> None:
    raw.send(frames)
    reply = raw.reply()
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert message in reply.error
    _still_serving(client)


def test_foreign_protocol_is_answered_not_crashing(client: Client, raw: Raw) -> None:
    raw.send([b"GET / HTTP/1.1"])
    assert raw.reply().status == protocol.Status.INVALID_ARGUMENT
    _still_serving(client)


def _infer_header(
    region_name: str, offset: int, nbytes: int, shape: list[int] | None = None
) -> dict[str, Any]:
    shape = shape or [1, 1]
    tensor = {"datatype": "FP32", "shape": shape, "shm": [region_name, offset, nbytes]}
    return {
        "model": "add",
        "version": 0,
        "inputs": [{"name": "INPUT_A", **tensor}, {"name": "INPUT_B", **tensor}],
        "outputs": [{"name": "OUTPUT_SUM", "slot": [region_name, 0, 4]}],
    }


@pytest.mark.parametrize(
    "offset, nbytes, shape, message",
    [
        (4096, 4, None, "invalid offset + byte size"),
        (4093, 4, None, "invalid offset + byte size"),
        (2**63 - 1, 4, None, "invalid offset + byte size"),
        (0, 8, None, "byte size mismatch"),
        (0, 2**62, [2**31, 2**31], "byte limit"),
    ],
)
def test_descriptors_out_of_bounds_are_refused(
    client: Client, raw: Raw, region: Segment, offset: int, nbytes: int, shape: list[int] | None, message: str
) -> None:
    reply = raw.call(Command.INFER, _infer_header(region.name, offset, nbytes, shape))
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert message in reply.error
    assert region.name not in reply.error
    _still_serving(client)


def test_descriptor_inside_region_works(raw: Raw, region: Segment) -> None:
    np.frombuffer(region.buf, np.float32, count=1, offset=64)[0] = 20.5
    header = _infer_header(region.name, 64, 4)
    header["outputs"][0]["slot"] = [region.name, 128, 4]
    reply = raw.call(Command.INFER, header)
    assert reply.status == protocol.Status.OK, reply.error
    assert np.frombuffer(region.buf, np.float32, count=1, offset=128)[0] == 41.0


def test_output_slot_out_of_bounds_is_refused(raw: Raw, region: Segment) -> None:
    header = _infer_header(region.name, 0, 4)
    header["outputs"][0]["slot"] = [region.name, 4094, 4]
    reply = raw.call(Command.INFER, header)
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert "invalid offset + byte size" in reply.error


def test_region_of_another_connection_is_refused(client: Client, raw: Raw, region: Segment) -> None:
    other = Raw(raw.sock.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        reply = other.call(Command.INFER, _infer_header(region.name, 0, 4))
        assert reply.status == protocol.Status.INVALID_ARGUMENT
        assert "not registered" in reply.error
    finally:
        other.close()
    _still_serving(client)


@pytest.mark.parametrize(
    "name, message",
    [
        ("zinfer-s0-feedfacefeedface", "reserved"),
        ("../../etc/passwd", "region name"),
        ("", "'name' must be 1 to 256"),
    ],
)
def test_bad_region_registration(raw: Raw, name: str, message: str) -> None:
    seg = Segment.create_sealed(4096)
    try:
        reply = raw.register(seg, name)
        assert reply.status == protocol.Status.INVALID_ARGUMENT
        assert message in reply.error
    finally:
        seg.close()


@pytest.mark.parametrize("token", [None, b"", b"x" * 16, "a string", 7])
def test_register_without_a_handed_over_segment_is_refused(raw: Raw, token: object) -> None:
    """A name alone proves nothing: REGISTER must claim a descriptor handed over under its token."""
    header: dict[str, Any] = {"name": "zinfer-c0123456789abcdef"}
    if token is not None:
        header["token"] = token
    reply = raw.call(Command.REGISTER, header)
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert "token" in reply.error


def test_unregister_unknown_region(raw: Raw) -> None:
    reply = raw.call(Command.UNREGISTER, {"name": "zinfer-c1-0000000000000001"})
    assert reply.status == protocol.Status.NOT_FOUND


def test_region_shrunk_after_registration_gives_error_not_sigbus(
    client: Client, raw: Raw, region: Segment
) -> None:
    """A registered segment is sealed: the client cannot shrink it; a worker never meets a missing page."""
    with pytest.raises(PermissionError):
        os.ftruncate(region.fd, 64)
    np.frombuffer(region.buf, np.float32, count=1, offset=1024)[0] = 1.5
    header = _infer_header(region.name, 1024, 4)
    header["outputs"][0]["slot"] = [region.name, 2048, 4]
    reply = raw.call(Command.INFER, header)
    assert reply.status == protocol.Status.OK, reply.error
    assert np.frombuffer(region.buf, np.float32, count=1, offset=2048)[0] == 3.0
    _still_serving(client)


def test_unknown_fields_of_wrong_type(raw: Raw) -> None:
    reply = raw.call(Command.INFER, {"model": 42, "inputs": []})
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    reply = raw.call(Command.MODEL_METADATA, {"model": ["x"]})
    assert reply.status == protocol.Status.INVALID_ARGUMENT
