"""The worker's own socket calls (``workers.worker_socket``) send and receive what pyzmq's methods do: every
frame in order, the envelope as bytes and the rest without a copy, big frames without a copy on send; the
readiness test and the waiter see a message and a wake-up descriptor, and wait no longer than asked."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from zinfer.client import protocol
from zinfer.client.protocol import COPY_THRESHOLD, Command
from zinfer.client.transport import send_frames
from zinfer.client.worker_protocol import decode_execute
from zinfer.workers.worker_socket import Waiter, readable, recv_buffers


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for s in (a, b):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 2000)
    endpoint = f"ipc://{tmp_path / 'p.sock'}"
    a.bind(endpoint)
    b.connect(endpoint)
    try:
        yield a, b
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_frames_arrive_in_order_whole_and_the_envelope_as_bytes(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    big = np.arange(COPY_THRESHOLD, dtype=np.uint8)  # sent without a copy
    frames = protocol.encode(Command.W_CANCEL, {"batch": 3, "id": 4}, [b"one", big.data])
    send_frames(a, frames)
    got = recv_buffers(b)
    assert len(got) == 3
    assert isinstance(got[0], bytes) and got[0] == bytes(frames[0])
    assert bytes(got[1]) == b"one" and bytes(got[2]) == big.tobytes()
    message = protocol.decode(got)
    assert message.command == Command.W_CANCEL and message.header == {"batch": 3, "id": 4}


def test_a_lone_envelope_is_one_frame_and_decodes_as_an_execute(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    send_frames(a, protocol.encode(Command.W_EXECUTE, {"batch": 9, "requests": []}))
    got = recv_buffers(b)
    assert len(got) == 1
    decoded = decode_execute(got)
    assert decoded is not None and decoded.command == Command.W_EXECUTE


def test_receive_times_out_with_again(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    _, b = pair
    b.setsockopt(zmq.RCVTIMEO, 50)
    with pytest.raises(zmq.Again):
        recv_buffers(b)


def test_readable_says_whether_a_message_is_there(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    a, b = pair
    assert not readable(b)
    send_frames(a, [b"x"])
    deadline = time.monotonic() + 10
    while not readable(b):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert recv_buffers(b) == [b"x"]
    assert not readable(b)


def test_the_waiter_sees_the_message_and_the_descriptor_apart(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    r, w = os.pipe()
    try:
        waiter = Waiter(b, r)
        t0 = time.monotonic()
        assert waiter.wait(50) == (False, False)
        assert time.monotonic() - t0 >= 0.04
        os.write(w, b"x")
        assert waiter.wait(2000) == (False, True)
        os.read(r, 1)
        send_frames(a, [b"m"])
        assert waiter.wait(2000) == (True, False)
        os.write(w, b"x")
        assert waiter.wait(2000) == (True, True)
    finally:
        os.close(r)
        os.close(w)
