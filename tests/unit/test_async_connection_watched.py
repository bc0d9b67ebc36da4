"""``AsyncConnection.send_watched`` (the HTTP door's direct path: ``send`` and ``wait`` without a coroutine):
``done`` gets the reply, or the error ``wait`` raises (a timeout, ``Unsent``), and the reply to a request that
timed out goes to ``on_late_reply`` as it does after ``wait``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import zmq

from zinfer.client import protocol
from zinfer.client.async_connection import AsyncConnection
from zinfer.client.connection import Unsent
from zinfer.client.errors import ClientError, ConnectionFailed, RequestTimeout, Status
from zinfer.client.protocol import Command, Reply


class _SlowServer:
    """A ROUTER that answers each request after the delay its header names (``delay_ms``), on a thread."""

    def __init__(self, url: str) -> None:
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
                reply = protocol.reply_to_wire(Reply(item[2], Status.OK, body={"ok": item[2]}))
                self._sock.send_multipart([item[1], *protocol.encode(Command.REPLY, reply, ())])

    def close(self) -> None:
        self._stop = True
        self._thread.join(10)
        self._sock.close(linger=0)
        self._ctx.term()


def _run(go: Callable[[], Coroutine[Any, Any, None]], server: _SlowServer) -> None:
    """Run the test's coroutine, then stop its server whatever happened."""
    try:
        asyncio.run(go())
    finally:
        server.close()


def _watched(conn: AsyncConnection, delay_ms: float, timeout: float) -> asyncio.Future[Any]:
    """Send one request answered after ``delay_ms``; a future of (id, the future ``done`` was given)."""
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    rid = conn.new_id()
    header = {"id": rid, "model": "m", "parameters": {"delay_ms": delay_ms}}
    conn.send_watched(Command.INFER, header, (), timeout, lambda r, fut: got.set_result((r, rid, fut)))
    return got


def test_done_gets_the_reply_or_the_timeout_and_a_late_reply_is_told(tmp_path: Path) -> None:
    url = f"ipc://{tmp_path / 's.sock'}"
    server = _SlowServer(url)
    late: list[str] = []

    async def go() -> None:
        conn = AsyncConnection(url, late.append)
        try:
            given, rid, fut = await asyncio.wait_for(_watched(conn, 0, 10.0), 10)
            assert given == rid and fut.result()[0].body == {"ok": rid} and conn.in_flight == 0
            given, rid, fut = await asyncio.wait_for(_watched(conn, 300, 0.05), 10)
            assert given == rid and isinstance(fut.exception(), RequestTimeout) and late == []
            for _ in range(100):  # its reply comes after all: told as a late reply
                if late:
                    break
                await asyncio.sleep(0.02)
            assert late == [rid] and conn.in_flight == 0
            # many at once, answered in any order: each its own
            many = [_watched(conn, (7 * i) % 5, 10.0) for i in range(20)]
            for given, rid, fut in await asyncio.wait_for(asyncio.gather(*many), 10):
                assert given == rid and fut.result()[0].body == {"ok": rid}
        finally:
            await conn.aclose()

    _run(go, server)


def test_done_gets_unsent_when_no_server_is_there(tmp_path: Path) -> None:
    late: list[str] = []

    async def go() -> None:
        conn = AsyncConnection(f"ipc://{tmp_path / 'none.sock'}", late.append)
        try:
            _, _, fut = await asyncio.wait_for(_watched(conn, 0, 10.0), 10)
            assert isinstance(fut.exception(), Unsent) and conn.in_flight == 0
        finally:
            await conn.aclose()

    asyncio.run(go())
    assert late == []


def test_closing_the_connection_ends_each_waiting_request_once_with_the_error_and_none_is_left(
    tmp_path: Path,
) -> None:
    """Requests waiting on a server that has not answered yet: ``close`` ends each with ``ClientError``
    (``done`` called once, at once), nothing is left in flight, and a reply that comes after is nobody's."""
    url = f"ipc://{tmp_path / 'c.sock'}"
    server = _SlowServer(url)
    late: list[str] = []

    async def go() -> None:
        conn = AsyncConnection(url, late.append)
        calls: dict[str, list[Any]] = {}
        try:
            rids = [conn.new_id() for _ in range(5)]

            def done(rid: str, watched: Any) -> None:
                calls.setdefault(rid, []).append(watched)

            for rid in rids:
                header = {"id": rid, "model": "m", "parameters": {"delay_ms": 2000}}
                conn.send_watched(Command.INFER, header, (), 10.0, done)
            await asyncio.sleep(0.05)  # sent, not answered
            assert calls == {} and conn.in_flight == 5
        finally:
            await conn.aclose()
        assert sorted(calls) == sorted(rids) and all(len(v) == 1 for v in calls.values())
        for w in (v[0] for v in calls.values()):
            assert w.done() and not w.cancelled() and type(w.exception()) is ClientError
            with pytest.raises(ClientError):
                w.result()
        assert conn.in_flight == 0

    _run(go, server)


def test_a_lost_connection_fails_what_went_out_and_spares_what_is_still_queued(tmp_path: Path) -> None:
    """The connection drops (``LinkWatch`` reports it) while one request waits for its reply and another is
    queued in the same turn, not sent yet: the first ends with ``ConnectionFailed`` (its reply, if it comes,
    is late), the second goes out after all and is answered; a plain ``send`` future is treated the same."""
    url = f"ipc://{tmp_path / 'l.sock'}"
    server = _SlowServer(url)

    async def go() -> None:
        conn = AsyncConnection(url)
        try:
            sent = _watched(conn, 3000, 10.0)
            plain_sent = conn.send(Command.INFER, {"id": conn.new_id(), "parameters": {"delay_ms": 3000}}, ())
            await asyncio.sleep(0.05)  # both went out; no reply for 3 s
            queued = _watched(conn, 0, 10.0)
            plain_queued = conn.send(Command.INFER, {"id": conn.new_id()}, ())
            conn._lost(ConnectionFailed("the connection was lost"))
            _, _, w = await asyncio.wait_for(sent, 5)
            assert type(w.exception()) is ConnectionFailed
            assert type(plain_sent.exception()) is ConnectionFailed
            rid_q, given_q, wq = await asyncio.wait_for(queued, 5)
            assert rid_q == given_q and wq.exception() is None and wq.result()[0].body == {"ok": rid_q}
            reply, _ = await asyncio.wait_for(plain_queued, 5)
            assert reply.status == Status.OK
        finally:
            await conn.aclose()

    _run(go, server)


class _BundleServer(_SlowServer):
    """A ROUTER that answers every request of a message together, in one BUNDLE of replies, on a thread."""

    def _serve(self) -> None:
        while not self._stop:
            if not self._sock.poll(1):
                continue
            who, *frames = self._sock.recv_multipart()
            ids = [str(m.header["id"]) for m in protocol.decode_many(frames, protocol.CLIENT_COMMANDS)]
            replies = [
                (Command.REPLY, protocol.reply_to_wire(Reply(rid, Status.OK, body={"ok": rid})), ())
                for rid in ids
            ]
            out = protocol.encode_bundle(replies) if len(replies) > 1 else protocol.encode(*replies[0])
            self._sock.send_multipart([who, *out])


def test_done_is_called_once_as_the_reply_is_read_and_a_failing_done_spares_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replies of one message (a BUNDLE) each call their ``done`` once, as the reader reads them (the
    future is resolved by then); a ``done`` that raises is logged and the message's other replies still
    reach theirs."""
    url = f"ipc://{tmp_path / 'b.sock'}"
    server = _BundleServer(url)
    calls: dict[str, int] = {}

    async def go() -> None:
        conn = AsyncConnection(url)
        try:
            done_all: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            rids = [conn.new_id() for _ in range(8)]

            def done(rid: str, fut: asyncio.Future[Any]) -> None:
                calls[rid] = calls.get(rid, 0) + 1
                assert fut.done() and fut.result()[0].body == {"ok": rid}
                if len(calls) == len(rids) and not done_all.done():
                    done_all.set_result(None)
                if rid == rids[2]:
                    raise RuntimeError("a failing done")

            for rid in rids:  # queued in one turn: one BUNDLE out, one BUNDLE of replies back
                conn.send_watched(Command.INFER, {"id": rid, "model": "m"}, (), 10.0, done)
            await asyncio.wait_for(done_all, 10)
            for _ in range(5):  # a second call, had there been one, comes from the loop's callbacks
                await asyncio.sleep(0)
            assert calls == dict.fromkeys(rids, 1) and conn.in_flight == 0
        finally:
            await conn.aclose()

    _run(go, server)
    assert "event=reply_callback_failed" in caplog.text  # the reader's own log, not the loop's
