"""``client/connection.py``: a call that finds the socket free and the queue empty sends its own message at
once (no trip through the queue). What the queue gave stays: a call made before any server is there waits
for one (or fails ``Unsent``), threads sharing the connection each get their own replies, a reply that comes
after its caller timed out goes to ``on_late_reply``, and a message that cannot be encoded leaves the socket
free for the next call."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zinfer.client import protocol
from zinfer.client.connection import Connection, Unsent
from zinfer.client.errors import RequestTimeout, Status
from zinfer.client.protocol import Command, Reply


class EchoServer:
    """A ROUTER on a thread that answers each request after the delay its header names (``delay_ms``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(url)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        due: list[tuple[float, bytes, str]] = []
        while not self._stop:
            if self._sock.poll(1):
                who, *frames = self._sock.recv_multipart()
                for msg in protocol.decode_many(frames, protocol.CLIENT_COMMANDS):
                    delay = float(msg.header.get("parameters", {}).get("delay_ms", 0)) / 1000
                    due.append((time.monotonic() + delay, who, str(msg.header["id"])))
            now = time.monotonic()
            for item in [d for d in due if d[0] <= now]:
                due.remove(item)
                reply = protocol.reply_to_wire(Reply(item[2], Status.OK, body={"id": item[2]}))
                self._sock.send_multipart([item[1], *protocol.encode(Command.REPLY, reply, ())])

    def close(self) -> None:
        self._stop = True
        self._thread.join(10)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"ipc://{tmp_path / 's.sock'}"


@pytest.fixture
def server(url: str) -> Iterator[EchoServer]:
    s = EchoServer(url)
    try:
        yield s
    finally:
        s.close()


def _ask(conn: Connection, rid: str, delay_ms: float = 0, timeout: float = 30.0) -> Reply:
    header = {"id": rid, "parameters": {"delay_ms": delay_ms}}
    reply, _ = conn.request(Command.SERVER_LIVE, header, (), timeout, check=False)
    return reply


def test_calls_made_at_once_wait_for_the_connection(server: EchoServer) -> None:
    """Right after the connection is made the server's end is not connected yet: the send finds no peer
    (EAGAIN), and the call waits in the queue for the connection instead of failing."""
    for i in range(5):
        conn = Connection(server.url, heartbeat_interval=1.0)
        try:
            reply = _ask(conn, f"early{i}")
            assert reply.request_id == f"early{i}" and reply.body == {"id": f"early{i}"}
            assert not conn._out and not conn._waiters
        finally:
            conn.close()


def test_a_call_with_no_server_at_all_is_unsent(url: str) -> None:
    conn = Connection(url, heartbeat_interval=0.1)
    try:
        t0 = time.monotonic()
        with pytest.raises(Unsent):
            _ask(conn, "nobody", timeout=5.0)
        assert time.monotonic() - t0 < 4.0  # at once (no socket file), not after the call's timeout
        assert not conn._out and not conn._waiters
    finally:
        conn.close()


def test_threads_sharing_the_connection_each_get_their_own_replies(server: EchoServer) -> None:
    conn = Connection(server.url, heartbeat_interval=0)
    errors: list[str] = []

    def calls(t: int) -> None:
        rng = random.Random(t)
        for i in range(40):
            rid = f"t{t}-{i}"
            reply = _ask(conn, rid, rng.choice([0, 0, 0, 1, 3]))
            if reply.request_id != rid or reply.body != {"id": rid}:
                errors.append(f"{rid} got {reply.request_id}")

    try:
        _ask(conn, "warm")
        threads = [threading.Thread(target=calls, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads)
        assert errors == []
        assert not conn._waiters and not conn._out
    finally:
        conn.close()


def test_a_reply_after_its_caller_timed_out_goes_to_on_late_reply(server: EchoServer) -> None:
    late: list[str] = []
    conn = Connection(server.url, on_late_reply=late.append, heartbeat_interval=0)
    try:
        _ask(conn, "warm")
        with pytest.raises(RequestTimeout):
            _ask(conn, "slow", 300, timeout=0.1)
        time.sleep(0.4)  # the late reply has come: the next call's owner reads it
        assert _ask(conn, "after").request_id == "after"
        assert late == ["slow"]
    finally:
        conn.close()


def test_a_message_that_cannot_be_encoded_leaves_the_socket_free(server: EchoServer) -> None:
    conn = Connection(server.url, heartbeat_interval=0)
    try:
        _ask(conn, "warm")
        with pytest.raises(Exception):  # noqa: B017 - whatever the encoder raises reaches the caller
            conn.request(Command.SERVER_LIVE, {"id": "bad", "x": object()}, (), 5.0, check=False)
        t0 = time.monotonic()
        assert _ask(conn, "next", timeout=5.0).request_id == "next"
        assert time.monotonic() - t0 < 2.0
        assert "bad" not in conn._waiters
    finally:
        conn.close()


def test_a_call_with_no_time_at_all_is_never_sent(server: EchoServer) -> None:
    conn = Connection(server.url, heartbeat_interval=0)
    try:
        _ask(conn, "warm")
        with pytest.raises(Unsent):
            _ask(conn, "none", timeout=0.0)
        assert not conn._out and not conn._waiters
        assert _ask(conn, "next").request_id == "next"
    finally:
        conn.close()
