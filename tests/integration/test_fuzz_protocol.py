"""Property-based fuzzing of the broker's message decoding over a real socket (scenario 19).

Whatever a peer sends, the broker answers or drops it, never crashes, and keeps answering valid clients
correctly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ServerProcess
from zinfer.client import Client, protocol

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)
_SYNC = itertools.count()

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=40), st.binary(max_size=40),
)  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)
_keys = st.sampled_from(["id", "model", "version", "inputs", "outputs", "name", "shape", "datatype", "shm",
                         "frame", "priority", "timeout_us", "parameters", "slot"])  # fmt: skip
_headers = st.dictionaries(_keys | st.text(max_size=8), _values, max_size=8)
_commands = st.sampled_from([int(c) for c in protocol.Command]) | st.integers(0, 255)


@st.composite
def messages(draw: st.DrawFn) -> list[bytes]:
    kind = draw(st.integers(0, 3))
    if kind == 0:  # raw junk frames
        return draw(st.lists(st.binary(max_size=64), min_size=1, max_size=6))
    header = draw(_headers)
    if kind == 2 and draw(st.booleans()):  # an infer-shaped header with hostile fields
        tensors = st.lists(st.dictionaries(_keys, _values, max_size=6), max_size=3)
        header.update({"model": draw(st.sampled_from(["add", "identity", "nope"])), "version": 0,
                       "inputs": draw(tensors)})  # fmt: skip
    body = msgpack.packb(header, use_bin_type=True) if kind != 3 else draw(st.binary(max_size=64))
    command = bytes([draw(_commands)])
    extra = draw(st.lists(st.binary(max_size=32), max_size=3))
    return [b"ZNF1" + command + body, *extra]


@pytest.fixture(scope="module")
def sockets(bundled_server: ServerProcess) -> Iterator[tuple[zmq.Socket[bytes], Client]]:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(bundled_server.url)
    with Client(bundled_server.url, timeout=20) as client:
        yield sock, client
    sock.close(linger=0)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(msg=messages())
def test_broker_survives_any_message(sockets: tuple[zmq.Socket[bytes], Client], msg: list[bytes]) -> None:
    sock, client = sockets
    sock.send_multipart(msg)
    # The broker handles one connection's messages in order: once the answer to a SERVER_LIVE sent after
    # the fuzzed message is back, any answer to the fuzzed message came before it. No fixed wait.
    sync = f"sync-{next(_SYNC)}"
    sock.send_multipart(protocol.encode(protocol.Command.SERVER_LIVE, {"id": sync}))
    while True:
        assert sock.poll(20_000), "the broker stopped answering"
        reply: Any = protocol.decode(sock.recv_multipart())
        assert reply.command == protocol.Command.REPLY  # an answer, if any, is a well-formed reply
        if protocol.reply_from_wire(reply.header).request_id == sync:
            break
    out = client.infer("add", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}).as_numpy("OUTPUT_SUM")
    assert out[0, 0] == 3.0
