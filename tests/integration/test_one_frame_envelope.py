"""The one-frame envelope against a real server: a peer speaking the older multi-frame shape, or sending
garbage where the envelope belongs, gets a clear error and the server keeps serving everyone else."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import numpy as np
import pytest

from tests.conftest import ServerProcess
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.protocol import Command

ONE = np.ones((1, 1), dtype=np.float32)


@pytest.fixture(scope="module")
def client(bundled_server: ServerProcess) -> Iterator[Client]:
    with Client(bundled_server.url, timeout=30) as c:
        yield c


@pytest.fixture
def raw(bundled_server: ServerProcess) -> Iterator[Raw]:
    r = Raw(bundled_server.url)
    yield r
    r.close()


def _still_serving(client: Client) -> None:
    out = client.infer("add", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}).as_numpy("OUTPUT_SUM")
    assert out[0, 0] == 3.0


def _old_shape(command: Command, header: dict[str, object], *frames: bytes) -> list[bytes]:
    return [protocol.PROTOCOL, bytes([command]), msgpack.packb(header), *frames]


@pytest.mark.parametrize(
    "frames",
    [
        _old_shape(Command.SERVER_LIVE, {"id": "old"}),
        _old_shape(Command.INFER, {"id": "old", "model": "add", "inputs": []}, b"\0" * 4, b"\0" * 4),
    ],
)
def test_the_older_multi_frame_shape_gets_a_clear_error(
    client: Client, raw: Raw, frames: list[bytes]
) -> None:
    raw.send(frames)
    reply = raw.reply()
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert "older shape" in reply.error and "one frame" in reply.error
    assert reply.request_id == ""  # nothing of a message in the old shape is read, its id neither
    _still_serving(client)


@pytest.mark.parametrize(
    "frames, message",
    [
        ([b"ZNF1\x05"], "no header"),
        ([b"ZN"], "unknown protocol"),
        ([b"ZNF2\x05" + msgpack.packb({"id": "x"})], "unknown protocol"),
        ([b"\x00" * 64, b"more"], "unknown protocol"),
        ([b"ZNF1\x05" + msgpack.packb({"id": "x"}) + b"\xc1"], "malformed header"),
    ],
)
def test_garbage_envelopes_get_errors(client: Client, raw: Raw, frames: list[bytes], message: str) -> None:
    raw.send(frames)
    reply = raw.reply()
    assert reply.status == protocol.Status.INVALID_ARGUMENT
    assert message in reply.error
    _still_serving(client)


def test_the_one_frame_envelope_is_served(raw: Raw) -> None:
    wire = protocol.encode(Command.SERVER_LIVE, {"id": "one"})
    assert len(wire) == 1 and bytes(wire[0]).startswith(protocol.PROTOCOL + bytes([Command.SERVER_LIVE]))
    raw.send([bytes(f) for f in wire])
    reply = raw.reply()
    assert (reply.request_id, reply.status, reply.body) == ("one", protocol.Status.OK, True)
