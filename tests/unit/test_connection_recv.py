"""``client/connection.py``: a thread alone on a connection blocks in recv for its reply; a thread that comes
while it does still gets its message out at once (within the recv slice), and replies find their callers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zinfer.client import protocol
from zinfer.client.connection import _FAST_RECV_MS, Connection
from zinfer.client.errors import RequestTimeout, Status
from zinfer.client.protocol import Command, Reply


class FakeServer:
    """A ROUTER that answers each request after the delay its header names (``delay_ms``), on a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.arrived: dict[str, float] = {}
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(url)
        self._stop = False
        self._preload: list[str] = []  # replies to send before their requests come (``preload``)
        self.preloaded = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        due: list[tuple[float, bytes, str]] = []
        peer = b""
        while not self._stop:
            if self._preload and peer:
                rids, self._preload = self._preload, []
                for rid in rids:
                    reply = protocol.reply_to_wire(Reply(rid, Status.OK, body={"ok": True}))
                    self._sock.send_multipart([peer, *protocol.encode(Command.REPLY, reply, ())])
                self.preloaded.set()
            if self._sock.poll(1):
                who, *frames = self._sock.recv_multipart()
                peer = who
                for msg in protocol.decode_many(frames, protocol.CLIENT_COMMANDS):
                    rid = str(msg.header["id"])
                    self.arrived[rid] = time.monotonic()
                    delay = float(msg.header.get("parameters", {}).get("delay_ms", 0)) / 1000
                    due.append((time.monotonic() + delay, who, rid))
            now = time.monotonic()
            for item in [d for d in due if d[0] <= now]:
                due.remove(item)
                reply = protocol.reply_to_wire(Reply(item[2], Status.OK, body={"ok": True}))
                self._sock.send_multipart([item[1], *protocol.encode(Command.REPLY, reply, ())])

    def preload(self, rids: list[str]) -> None:
        """Answer ``rids`` now, to the last peer, before they are asked."""
        self._preload = list(rids)

    def close(self) -> None:
        self._stop = True
        self._thread.join(10)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeServer]:
    s = FakeServer(f"ipc://{tmp_path / 's.sock'}")
    try:
        yield s
    finally:
        s.close()


def _ask(conn: Connection, rid: str, delay_ms: float, timeout: float = 30.0) -> Reply:
    header = {"id": rid, "parameters": {"delay_ms": delay_ms}}
    reply, _ = conn.request(Command.SERVER_LIVE, header, (), timeout, check=False)
    return reply


@pytest.mark.parametrize("delay_ms", [0, _FAST_RECV_MS / 2, _FAST_RECV_MS * 5, 120])
def test_a_lone_caller_gets_its_reply_however_long_it_takes(server: FakeServer, delay_ms: float) -> None:
    conn = Connection(server.url, heartbeat_interval=0)
    try:
        _ask(conn, "warm", 0)  # connected (slow on a loaded machine)
        for i in range(5):
            reply = _ask(conn, f"r{i}", delay_ms)
            assert reply.request_id == f"r{i}" and reply.status == Status.OK
    finally:
        conn.close()


def test_a_thread_that_comes_while_the_owner_waits_in_recv_is_sent_at_once(server: FakeServer) -> None:
    """A's reply takes 1.5 s; B, which comes meanwhile, has its request at the server long before that
    and its reply first."""
    conn = Connection(server.url, heartbeat_interval=0)
    done: dict[str, float] = {}
    try:
        _ask(conn, "warm", 0)

        def call(rid: str, delay_ms: float) -> None:
            _ask(conn, rid, delay_ms)
            done[rid] = time.monotonic()

        a = threading.Thread(target=call, args=("a", 1500))
        a.start()
        deadline = time.monotonic() + 10
        while "a" not in server.arrived:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        sent_b = time.monotonic()
        call("b", 0)
        a.join(10)
        assert not a.is_alive()
        assert done["b"] < done["a"]
        assert server.arrived["b"] - sent_b < 0.5, "B's request waited for A's reply"
    finally:
        conn.close()


def test_a_lone_callers_timeout_is_kept(server: FakeServer) -> None:
    conn = Connection(server.url, heartbeat_interval=0)
    try:
        _ask(conn, "warm", 0)
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout):
            _ask(conn, "slow", 2000, timeout=0.2)
        assert 0.2 <= time.monotonic() - t0 < 1.5
    finally:
        conn.close()


class CountingPoller(zmq.Poller):
    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def poll(self, timeout: int | None = None) -> list[tuple[object, int]]:  # type: ignore[override]
        self.polls += 1
        return super().poll(timeout)


def test_a_lone_caller_neither_polls_nor_uses_the_wake_pipe(server: FakeServer) -> None:
    """Replies that are there (or come within the recv slice): no poll of the socket and the pipe at all.
    The server answers before it is asked, so how loaded the machine is does not matter."""
    conn = Connection(server.url, heartbeat_interval=0)
    poller = CountingPoller()
    poller.register(conn._sock, zmq.POLLIN)
    poller.register(conn._wake_r, zmq.POLLIN)
    conn._poller = poller
    try:
        _ask(conn, "warm", 0)  # connected
        server.preload([f"r{i}" for i in range(20)])
        assert server.preloaded.wait(30)
        assert conn._sock.poll(30_000) == zmq.POLLIN  # they have landed
        for i in range(20):
            _ask(conn, f"r{i}", 60_000)  # the server's own answer would come after the test
        assert poller.polls < 5, f"{poller.polls} polls for 20 lone calls"  # one a call before
        assert not conn._woken
        _ask(conn, "slow", _FAST_RECV_MS * 10)  # past the slice: the poll takes over
        assert poller.polls >= 1
    finally:
        conn.close()
