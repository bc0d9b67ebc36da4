"""One DEALER connection to a server, shared safely by many threads.

Each call registers a waiter under a fresh request id and sends; then whichever waiting thread holds the
receive lock reads replies for everyone and wakes their owners. A reply nobody waits for any more (its
caller timed out) goes to ``on_late_reply``, so the caller's resources can be released only then.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import protocol
from .errors import ClientError, ConnectionFailed, ProtocolError, RequestTimeout
from .link_watch import HEARTBEAT_INTERVAL_S, LinkWatch, apply_heartbeats, connect_wait
from .paths import check_server_socket
from .protocol import Command, Frame, Reply, is_final
from .transport import NOBLOCK, send_frames

log = logging.getLogger(__name__)

_POLL_SLICE_S = 0.001  # receive slice while other threads are waiting to send
_REPLY_ONLY = frozenset({Command.REPLY})
_SERVER_CHECK_S = 0.5  # while waiting, how often to check that a local server is still there
_CONNECT_SLICE_MS = 10  # while a send waits for a connection, how long it holds the socket at a time


@dataclass(frozen=True)
class CurveKeys:
    """Keys for a CURVE-secured TCP server (Z85 text or raw 32 bytes)."""

    server_public: bytes
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of the server (before it connects)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    @classmethod
    def from_files(
        cls, server_cert: str | os.PathLike[str], client_secret_cert: str | os.PathLike[str]
    ) -> CurveKeys:
        """From files written by ``zinfer keys``: the server's public one and the client's secret one."""
        import zmq.auth

        server_public, _ = zmq.auth.load_certificate(os.fspath(server_cert))
        public, secret = zmq.auth.load_certificate(os.fspath(client_secret_cert))
        if secret is None:
            raise ClientError(f"{client_secret_cert}: no secret key in the file")
        return cls(server_public, public, secret)


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    reply: Reply | None = None
    frames: list[Frame] = field(default_factory=list)
    stream: deque[tuple[Reply, list[Frame]]] | None = None  # several replies (decoupled models)
    sent: bool = False  # only a request that went out can be lost with the connection
    error: ConnectionFailed | None = None  # the connection was lost while this waited


class Connection:
    def __init__(
        self,
        url: str,
        on_late_reply: Callable[[str], None] | None = None,
        curve: CurveKeys | None = None,
        server_uid: int | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.url = url
        self.server_uid = server_uid
        self.heartbeat_interval = heartbeat_interval
        self._on_late = on_late_reply
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        apply_heartbeats(self._sock, heartbeat_interval)
        if curve is not None:
            curve.apply(self._sock)
        self._waiters_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._link = LinkWatch(self._sock, url, self._lost)
        self._sock.connect(url)
        self._sock_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._late: set[str] = set()
        self._senders = 0
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}-"
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._link.close()
        self._sock.close(linger=0)

    def new_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def request(
        self, command: Command, header: dict[str, Any], frames: Sequence[Frame], timeout: float
    ) -> tuple[Reply, list[Frame]]:
        """Send one message and wait up to ``timeout`` seconds for its reply.

        The request id is ``header["id"]`` when the caller set one (see ``new_id``), else a fresh one. After
        a ``RequestTimeout`` the reply, if it ever comes, goes to ``on_late_reply`` with that id.
        """
        if self._closed:
            raise ClientError("the client is closed")
        self.check_server()
        rid = header.setdefault("id", self.new_id())
        waiter = _Waiter()
        msg = protocol.encode(command, header, frames)
        self._link.poll()  # a loss reported before this request must not fail it
        with self._waiters_lock:
            self._waiters[rid] = waiter
            self._senders += 1
        try:
            self._send(msg, timeout)
        except BaseException:
            with self._waiters_lock:
                self._waiters.pop(rid, None)  # nothing was sent
            raise
        finally:
            with self._waiters_lock:
                self._senders -= 1
                waiter.sent = True
        try:
            self._wait(waiter, time.monotonic() + timeout)
        except (RequestTimeout, ConnectionFailed):
            with self._waiters_lock:
                if self._waiters.pop(rid, None) is not None:
                    self._late.add(rid)
            raise
        assert waiter.reply is not None
        return waiter.reply, waiter.frames

    def stream(
        self, command: Command, header: dict[str, Any], frames: Sequence[Frame], timeout: float
    ) -> Iterator[tuple[Reply, list[Frame]]]:
        """Send one message and yield its replies until the final one; ``timeout`` bounds each wait."""
        if self._closed:
            raise ClientError("the client is closed")
        self.check_server()
        rid = header.setdefault("id", self.new_id())
        waiter = _Waiter(stream=deque())
        self._link.poll()
        with self._waiters_lock:
            self._waiters[rid] = waiter
        try:
            self._send(protocol.encode(command, header, frames), timeout)
        except BaseException:
            with self._waiters_lock:
                self._waiters.pop(rid, None)
            raise
        with self._waiters_lock:
            waiter.sent = True
        try:
            while True:
                while waiter.stream:
                    reply, rframes = waiter.stream.popleft()
                    yield reply, rframes
                    if is_final(reply):
                        return
                waiter.event.clear()
                if not waiter.stream:
                    self._wait(waiter, time.monotonic() + timeout)
        finally:
            with self._waiters_lock:
                if self._waiters.pop(rid, None) is not None:  # abandoned before the end
                    self._late.add(rid)

    def check_server(self) -> None:
        """A local server's socket file is gone when the server is: say so at once instead of timing out.
        A socket made by a user we do not trust, or a symbolic link, is refused (``check_server_socket``)."""
        if self.url.startswith("ipc://"):
            check_server_socket(self.url[6:], self.server_uid)

    def send_only(self, command: Command, header: dict[str, Any]) -> None:
        """Send without waiting for the answer (which is then dropped); dropped too while no server is
        connected, or once the connection is closed (a stream abandoned after ``close``)."""
        if self._closed:
            return
        header.setdefault("id", self.new_id())
        with self._sock_lock:
            try:
                send_frames(self._sock, protocol.encode(command, header), NOBLOCK)
            except zmq.Again:
                log.debug("event=send_dropped reason=not_connected")

    def _send(self, msg: Sequence[Frame], timeout: float) -> None:
        """Send ``msg`` once a server is connected; ``ConnectionFailed`` (nothing sent) when none is
        within ``connect_wait``. While connected a send never waits: libzmq queues it."""
        deadline = time.monotonic() + connect_wait(self.heartbeat_interval, timeout)
        while True:
            with self._sock_lock:
                try:
                    send_frames(self._sock, msg, NOBLOCK)  # libzmq takes every frame once the first is in
                    return
                except zmq.Again:
                    pass
                if time.monotonic() >= deadline:
                    raise ConnectionFailed(f"no connection to a zinfer server at {self.url}")
                self._sock.poll(_CONNECT_SLICE_MS, zmq.POLLOUT)
            self.check_server()

    def _lost(self, exc: ConnectionFailed) -> None:
        """The connection dropped: every call waiting for a reply fails (``LinkWatch``)."""
        with self._waiters_lock:
            waiters = [w for w in self._waiters.values() if w.sent]
        for waiter in waiters:
            waiter.error = exc
            waiter.event.set()

    def _wait(self, waiter: _Waiter, deadline: float) -> None:
        next_check = time.monotonic() + _SERVER_CHECK_S
        while not waiter.event.is_set() and waiter.error is None:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise RequestTimeout("no reply from the server within the timeout")
            if now >= next_check:
                next_check = now + _SERVER_CHECK_S
                self.check_server()
            if not self._recv_lock.acquire(blocking=False):
                waiter.event.wait(min(remaining, _POLL_SLICE_S * 5))
                continue
            try:
                if not waiter.event.is_set():
                    self._receive(min(remaining, _POLL_SLICE_S if self._senders else 0.05))
                    self._link.poll()
            finally:
                self._recv_lock.release()
        if waiter.error is not None and waiter.reply is None:
            raise waiter.error

    def _receive(self, wait_s: float) -> None:
        got: list[list[zmq.Frame]] = []
        sock = self._sock
        with self._sock_lock:
            if sock.poll(max(1, int(wait_s * 1000)), zmq.POLLIN):
                while len(got) < 1024:
                    got.append(sock.recv_multipart(copy=False))
                    if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                        break
        for raw in got:
            self._dispatch([f.buffer for f in raw])

    def _dispatch(self, raw: list[Any]) -> None:
        try:
            msg = protocol.decode(raw, _REPLY_ONLY)
            reply = protocol.reply_from_wire(msg.header)
        except ProtocolError as exc:
            log.warning("event=bad_reply error=%r", str(exc))
            return
        with self._waiters_lock:
            waiter = self._waiters.get(reply.request_id)
            if waiter is not None and (waiter.stream is None or is_final(reply)):
                del self._waiters[reply.request_id]
            late = reply.request_id in self._late and is_final(reply)
            if late:
                self._late.discard(reply.request_id)
        if waiter is not None:
            if waiter.stream is not None:
                waiter.stream.append((reply, msg.frames))
            else:
                waiter.reply = reply
                waiter.frames = msg.frames
            waiter.event.set()
        elif late and self._on_late is not None:
            self._on_late(reply.request_id)
