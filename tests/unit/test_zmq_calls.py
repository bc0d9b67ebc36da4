"""``client/zmq_calls.py`` and its users: pyzmq's Cython ``send`` called directly sends what pyzmq's own
``send`` sends and fails as it fails; a socket of another class keeps its own ``send``; the link watch that
asks its monitor's ``EVENTS`` only when the monitor's descriptor says so still sees every connection made
and lost; a quiet connection (sync, or the AsyncClient's and the front door's) checks its server's socket file
once, not per request or per turn, and again once a connection was made or lost."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from zinfer.client import paths, protocol, zmq_calls
from zinfer.client.async_connection import AsyncConnection
from zinfer.client.connection import Connection, Unsent
from zinfer.client.errors import ConnectionFailed
from zinfer.client.link_watch import LinkWatch
from zinfer.client.transport import recv_buffers, recv_frames, send_frames


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10_000)
    router.bind(f"ipc://{tmp_path / 'r.sock'}")
    dealer.connect(f"ipc://{tmp_path / 'r.sock'}")
    try:
        yield router, dealer
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


def test_the_fast_send_delivers_every_kind_of_frame(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, dealer = pair
    assert zmq_calls.fast(dealer)
    big = bytes(range(256)) * 1024  # 256 KiB: sent without a copy
    frames: list[Any] = [b"", b"small", memoryview(b"view"), bytearray(b"mutable"), big, zmq.Frame(b"frame")]
    send_frames(dealer, frames)
    got = recv_frames(router)
    assert [bytes(f.buffer) for f in got[1:]] == [b"", b"small", b"view", b"mutable", big, b"frame"]
    assert not got[-1].more


class _OwnSocket(zmq.Socket[bytes]):
    """A socket class of its own: ``recv_buffers`` leaves its ``recv`` to it."""


def test_recv_buffers_gives_every_frame_and_fails_as_pyzmq(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], tmp_path: Path
) -> None:
    router, dealer = pair
    assert type(dealer) is zmq_calls.PLAIN and zmq_calls.fast(dealer)  # the test transport makes inline
    big = bytes(range(256)) * 1024
    dealer.send(b"hello")
    who = router.recv_multipart()[0]
    router.send_multipart([who, b"env", b"", big, b"last"])
    got = recv_buffers(dealer)
    assert all(type(b) is memoryview for b in got)
    assert [bytes(b) for b in got] == [b"env", b"", big, b"last"]
    router.send_multipart([who, b"one"])
    assert [bytes(b) for b in recv_buffers(dealer)] == [b"one"]
    with pytest.raises(zmq.Again):  # nothing there: NOBLOCK fails as pyzmq's recv fails
        recv_buffers(dealer, int(zmq.NOBLOCK))
    ctx = zmq.Context()
    own = _OwnSocket(ctx, zmq.DEALER)
    try:
        assert not zmq_calls.fast(own) and type(own) is not zmq_calls.PLAIN
        own.setsockopt(zmq.LINGER, 0)
        own.connect(f"ipc://{tmp_path / 'r.sock'}")
        own.send(b"hi")
        peer = router.recv_multipart()[0]
        router.send_multipart([peer, b"a", b"b"])
        own.setsockopt(zmq.RCVTIMEO, 10_000)
        assert [bytes(b) for b in recv_buffers(own)] == [b"a", b"b"]
    finally:
        own.close(linger=0)
        ctx.term()


def test_the_fast_send_fails_as_pyzmqs_own(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, dealer = pair
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    with pytest.raises(zmq.ZMQError) as unknown:
        send_frames(router, [b"no-such-peer", b"x"], int(zmq.NOBLOCK))
    assert unknown.value.errno == errno.EHOSTUNREACH
    with pytest.raises(TypeError):
        send_frames(dealer, ["text is refused"])  # type: ignore[list-item]
    dealer.close(linger=0)
    with pytest.raises(zmq.ZMQError) as closed:
        send_frames(dealer, [b"x"])
    assert closed.value.errno == zmq.ENOTSOCK


class _CountingSocket(zmq.Socket):  # type: ignore[type-arg]
    sends = 0

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kw: Any) -> Any:
        type(self).sends += 1
        return super().send(data, flags, copy=copy, track=track, **kw)


class _CountingContext(zmq.Context):  # type: ignore[type-arg]
    _socket_class = _CountingSocket


def test_a_socket_of_another_class_keeps_its_own_send(tmp_path: Path) -> None:
    ctx = _CountingContext()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind(f"ipc://{tmp_path / 'p.sock'}")
        b.connect(f"ipc://{tmp_path / 'p.sock'}")
        assert not zmq_calls.fast(b)
        send_frames(b, [b"one", b"two"])
        assert _CountingSocket.sends == 2
        a.setsockopt(zmq.RCVTIMEO, 10_000)
        assert [bytes(f.buffer) for f in recv_frames(a)] == [b"one", b"two"]
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def _until(what: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.002)


def test_the_link_watch_sees_a_loss_after_many_quiet_looks(tmp_path: Path) -> None:
    url = f"ipc://{tmp_path / 's.sock'}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    server.bind(url)
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    lost: list[ConnectionFailed] = []
    watch = LinkWatch(client, url, lost.append)
    client.connect(url)
    try:
        _until(lambda: (watch.poll(), watch.changes)[1] >= 1)  # the connection made
        made = watch.changes
        for _ in range(2000):  # nothing happens: each look is one poll(2) of the monitor's descriptor
            watch.poll()
        assert watch.changes == made and not lost
        server.close(linger=0)
        _until(lambda: (watch.poll(), lost)[1])
        assert watch.changes > made
        assert "lost the connection" in str(lost[0])
    finally:
        watch.close()
        client.close(linger=0)
        server.close(linger=0)
        ctx.term()


def test_a_quiet_connection_checks_its_socket_file_once_and_again_when_it_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[str] = []
    real = paths.check_server_socket

    def counted(path: str, *args: Any) -> Any:
        checks.append(path)
        return real(path, *args)

    monkeypatch.setattr(paths, "check_server_socket", counted)
    url = f"ipc://{tmp_path / 's.sock'}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    server.bind(url)
    conn = Connection(url, heartbeat_interval=0)
    try:
        _until(lambda: (conn.server_check.check_changed(), conn._link.changes)[1] >= 1)
        conn.server_check.check_changed()  # the check after the connection was made
        before = len(checks)
        for _ in range(500):
            conn.server_check.check_changed()
        assert len(checks) == before, "a connection nothing happened to was checked again"
        server.close(linger=0)
        (tmp_path / "s.sock").unlink(missing_ok=True)  # as a server that stops removes it (or libzmq did)
        _until(lambda: (conn._link.poll(), conn._link.changes)[1] >= 2)
        with pytest.raises(ConnectionFailed, match="no zinfer server"):
            conn.server_check.check_changed()
        assert len(checks) == before + 1
    finally:
        conn.close()
        server.close(linger=0)
        ctx.term()


def test_an_async_connection_checks_its_socket_file_once_and_again_when_it_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn's send looked at the server's socket file (an ``lstat`` per flush: 1 in 7 of the front
    door's requests at HTTP c32); it now looks again only once the link reports a connection made or lost,
    and a server gone by then still fails what waits to go out."""
    checks: list[str] = []
    real = os.lstat

    def counted(path: Any, *args: Any, **kw: Any) -> Any:  # every look at the socket file is an lstat
        if str(path).endswith("s.sock"):
            checks.append(str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(os, "lstat", counted)
    sock_path = tmp_path / "s.sock"
    url = f"ipc://{sock_path}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    server.setsockopt(zmq.RCVTIMEO, 10_000)
    server.bind(url)
    query = protocol.server_query_to_wire(protocol.ServerQuery())

    async def scenario() -> None:
        conn = AsyncConnection(url, heartbeat_interval=0)
        deadline = time.monotonic() + 20

        async def until(what: Any) -> None:
            while not what():
                assert time.monotonic() < deadline, "not within the deadline"
                await asyncio.sleep(0.002)

        try:
            await until(lambda: (conn._link.poll(), conn._link.changes)[1] >= 1)  # connected
            conn.send_only(protocol.Command.SERVER_LIVE, dict(query))
            await asyncio.sleep(0)  # its flush: the first check
            before = len(checks)
            for _ in range(200):  # a flush per turn (each checks first, whether its send goes out or not)
                conn.send_only(protocol.Command.SERVER_LIVE, dict(query))
                await asyncio.sleep(0)
            await until(lambda: not conn._out)  # every turn's message went out
            assert before >= 1 and len(checks) == before, "a connection nothing happened to was checked again"
            server.close(linger=0)
            sock_path.unlink(missing_ok=True)  # as a server that stops removes it
            await until(lambda: (conn._link.poll(), conn._link.changes)[1] >= 2)
            header = dict(query)
            protocol.stamp_id(header, conn.new_id())
            fut = conn.send(protocol.Command.SERVER_LIVE, header, ())
            with pytest.raises(Unsent, match="no zinfer server"):
                await asyncio.wait_for(fut, 10)
            assert len(checks) == before + 1
        finally:
            conn.close()

    try:
        asyncio.run(scenario())
    finally:
        server.close(linger=0)
        ctx.term()


_CLOSE_EARLY = """
import sys, time, zmq
from zinfer.client.link_watch import LinkWatch
url = sys.argv[1]
server = zmq.Context().socket(zmq.ROUTER)
server.bind(url)
ctx = zmq.Context.instance()
for i in range(40):  # closed before, just as or after their connection is made: its event has no reader
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    w = LinkWatch(d, url, lambda exc: None)
    d.connect(url)
    time.sleep(i * 0.0001)
    w.close()
    d.close(linger=0)
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
w = LinkWatch(d, url, lambda exc: None)
d.connect(url)
deadline = time.monotonic() + 10
while w.changes < 1 and time.monotonic() < deadline:
    w.poll()
    time.sleep(0.002)
print("connected" if w.changes else "stuck", flush=True)
import os
os._exit(0)  # a stuck I/O thread would hang the context's termination
"""


def test_watches_closed_before_their_connection_is_made_leave_the_process_able_to_connect(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-c", _CLOSE_EARLY, f"ipc://{tmp_path / 'c.sock'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.stdout.strip() == "connected", out.stderr[-2000:]
