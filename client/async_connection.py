"""One DEALER connection for asyncio: any number of requests in flight, one reader task.

Each request registers a future under its request id and sends without waiting (the socket's queues are
unbounded: memory grows with the requests in flight, never a blocked send). One reader task receives the
replies and resolves their futures. A reply whose caller gave up (timeout or cancellation) goes to
``on_late_reply``, so its resources are released only then, as in the sync ``Connection``. Not
thread-safe: one connection serves one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import zmq
import zmq.asyncio

from . import protocol
from .connection import CurveKeys
from .errors import ClientError, ConnectionFailed, ProtocolError, RequestTimeout
from .link_watch import HEARTBEAT_INTERVAL_S, LinkWatch, apply_heartbeats, connect_wait
from .paths import check_server_socket
from .protocol import Command, Frame, Reply, is_final

log = logging.getLogger(__name__)

_REPLY_ONLY = frozenset({Command.REPLY})
_SERVER_CHECK_S = 0.5  # while requests wait, how often to check that a local server is still there
_DRAIN = 256  # replies handled before the reader lets other tasks run

_Item = tuple[Reply, list[Frame]]


class AsyncConnection:
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
        # An asyncio socket owning its handle (a shadow of a plain socket would leave that one to close the
        # handle a second time when it is collected, by then perhaps another socket's).
        self._sock = zmq.asyncio.Socket(zmq.Context.instance(), zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # thousands in flight: queue them, never refuse
        self._sock.setsockopt(zmq.RCVHWM, 0)  # and read every reply off the server's queue at once
        apply_heartbeats(self._sock, heartbeat_interval)
        if curve is not None:
            curve.apply(self._sock)
        self._link = LinkWatch(self._sock, url, self._lost)
        self._link_fd = -1  # watched by the event loop once one runs this connection
        self._sock.connect(url)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters: dict[str, asyncio.Future[tuple[Reply, list[Frame]]]] = {}
        self._streams: dict[str, asyncio.Queue[_Item | ClientError]] = {}  # decoupled models
        self._sending: set[str] = set()  # ids whose send waits for a connection: not lost with one
        self._late: set[str] = set()
        self._background: set[asyncio.Future[Any]] = set()  # sends still queued in the socket
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}-"
        self._closed = False

    @property
    def in_flight(self) -> int:
        return len(self._waiters)

    def new_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def check_server(self) -> None:
        """A local server's socket file is gone when the server is: say so at once instead of timing out.
        A socket made by a user we do not trust, or a symbolic link, is refused (``check_server_socket``)."""
        if self.url.startswith("ipc://"):
            check_server_socket(self.url[6:], self.server_uid)

    # ------------------------------------------------------------------------------------ requests

    async def request(
        self, command: Command, header: dict[str, Any], frames: Sequence[Frame], timeout: float
    ) -> tuple[Reply, list[Frame]]:
        """Send one message and wait up to ``timeout`` seconds for its reply (see ``send`` and ``wait``)."""
        rid = header.setdefault("id", self.new_id())
        fut = await self.send(command, header, frames, timeout)
        return await self.wait(rid, fut, timeout)

    async def send(
        self, command: Command, header: dict[str, Any], frames: Sequence[Frame], timeout: float = math.inf
    ) -> asyncio.Future[tuple[Reply, list[Frame]]]:
        """Send ``header`` (its ``id`` set) and the future its reply will resolve. When this raises, the
        message was not sent (``ConnectionFailed``: no server connected within ``connect_wait``)."""
        if self._closed:
            raise ClientError("the client is closed")
        self.check_server()
        loop = self._start()
        rid: str = header["id"]
        fut: asyncio.Future[tuple[Reply, list[Frame]]] = loop.create_future()
        self._link.poll()  # a loss reported before this request must not fail it
        self._waiters[rid] = fut
        msg = protocol.encode(command, header, frames)
        try:
            await self._send(msg, rid, timeout)
        except BaseException:
            self._waiters.pop(rid, None)
            raise
        return fut

    async def wait(
        self, rid: str, fut: asyncio.Future[tuple[Reply, list[Frame]]], timeout: float
    ) -> tuple[Reply, list[Frame]]:
        """The reply to ``rid``. If the caller gives up first (``RequestTimeout``, ``ConnectionFailed``, or
        the task is cancelled), the reply, if it ever comes, goes to ``on_late_reply``."""
        handle = fut.get_loop().call_later(max(0.0, timeout), _expire, fut)
        try:
            return await fut
        except BaseException:
            if self._waiters.pop(rid, None) is not None:
                self._late.add(rid)
            elif fut.done() and not fut.cancelled() and fut.exception() is None and self._on_late:
                self._on_late(rid)  # the reply came, but the task was cancelled before it could take it
            raise
        finally:
            handle.cancel()

    async def stream(
        self, command: Command, header: dict[str, Any], frames: Sequence[Frame], timeout: float
    ) -> AsyncIterator[tuple[Reply, list[Frame]]]:
        """Send one message and yield its replies until the final one; ``timeout`` bounds each wait."""
        if self._closed:
            raise ClientError("the client is closed")
        self.check_server()
        self._start()
        rid: str = header.setdefault("id", self.new_id())
        queue: asyncio.Queue[_Item | ClientError] = asyncio.Queue()
        self._link.poll()
        self._streams[rid] = queue
        done = False
        try:
            await self._send(protocol.encode(command, header, frames), rid, timeout)
            while not done:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout)
                except asyncio.TimeoutError:
                    raise RequestTimeout("no response from the server within the timeout") from None
                if isinstance(item, ClientError):
                    raise item
                reply, rframes = item
                done = is_final(reply)
                yield reply, rframes
        finally:
            self._streams.pop(rid, None)
            if not done:
                self._late.add(rid)

    def send_only(self, command: Command, header: dict[str, Any]) -> None:
        """Send without waiting for the answer (which is then dropped); never blocks, never raises."""
        if self._closed:
            return
        header.setdefault("id", self.new_id())
        self._start()
        msg = protocol.encode(command, header)
        sent = asyncio.ensure_future(self._sock.send_multipart(msg, flags=zmq.NOBLOCK))  # or dropped
        self._background.add(sent)  # kept alive while the socket holds it
        sent.add_done_callback(self._sent)

    def _sent(self, sent: asyncio.Future[Any]) -> None:
        self._background.discard(sent)
        if not sent.cancelled() and sent.exception() is not None:
            log.debug("event=send_failed error=%r", str(sent.exception()))

    async def _send(self, msg: list[Frame], rid: str, timeout: float) -> None:
        # Every send and receive goes through the asyncio socket: a send that bypassed it could consume
        # the edge of the file descriptor's readiness and leave the reader asleep with replies queued.
        sent = asyncio.ensure_future(self._sock.send_multipart(msg, copy=protocol.send_copy(msg)))
        if sent.done():  # connected: libzmq took it at once
            sent.result()
            return
        self._sending.add(rid)
        try:
            await asyncio.wait_for(sent, connect_wait(self.heartbeat_interval, timeout))
        except asyncio.TimeoutError:
            raise ConnectionFailed(f"no connection to a zinfer server at {self.url}") from None
        finally:
            self._sending.discard(rid)

    # ------------------------------------------------------------------------------------ reader

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._tasks.append(loop.create_task(self._read()))
            self._link.poll()  # losses before this loop ran concern no request
            self._link_fd = self._link.fd
            loop.add_reader(self._link_fd, self._link.poll)
            if self.url.startswith("ipc://"):
                self._tasks.append(loop.create_task(self._watch()))
        elif loop is not self._loop:
            raise ClientError("an AsyncClient serves one event loop: make one per loop")
        return loop

    async def _read(self) -> None:
        recv = self._sock.recv_multipart
        handled = 0
        try:
            while True:
                raw = await recv(copy=False)  # no yield when a reply is queued already
                try:
                    self._dispatch(raw)
                except Exception:  # one bad reply must not stop the reader every request waits on
                    log.exception("event=reply_dispatch_failed")
                handled += 1
                if handled >= _DRAIN:  # a flood of replies: let the callers run
                    handled = 0
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except zmq.ZMQError as exc:
            if not self._closed:
                log.warning("event=receive_failed error=%r", str(exc))
                self._fail_all(ConnectionFailed(f"receive failed: {exc}"))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_SERVER_CHECK_S)
            if self._waiters:
                try:
                    self.check_server()
                except ConnectionFailed as exc:
                    self._fail_all(exc)

    def _dispatch(self, raw: list[zmq.Frame]) -> None:
        try:
            msg = protocol.decode([f.buffer for f in raw], _REPLY_ONLY)
            reply = protocol.reply_from_wire(msg.header)
        except ProtocolError as exc:
            log.warning("event=bad_reply error=%r", str(exc))
            return
        rid = reply.request_id
        queue = self._streams.get(rid)
        if queue is not None:
            queue.put_nowait((reply, msg.frames))
            return
        if rid in self._late and not is_final(reply):
            return  # an abandoned stream: only its last response releases what it held
        fut = self._waiters.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result((reply, msg.frames))
        elif fut is not None or rid in self._late:  # its caller gave up already
            self._late.discard(rid)
            if self._on_late is not None:
                self._on_late(rid)

    def _fail_all(self, exc: ClientError, spare: set[str] | frozenset[str] = frozenset()) -> None:
        """Fail every request waiting for a reply (and every stream), except those in ``spare``."""
        for rid, fut in list(self._waiters.items()):
            if not fut.done() and rid not in spare:
                fut.set_exception(exc)
        for rid, queue in list(self._streams.items()):
            if rid not in spare:
                queue.put_nowait(exc)

    def _lost(self, exc: ConnectionFailed) -> None:
        """The connection dropped (``LinkWatch``): what went out on it will not be answered."""
        self._fail_all(exc, self._sending)

    # ------------------------------------------------------------------------------------ closing

    def close(self) -> None:
        """Fail what waits with ``ClientError`` and close the socket."""
        if self._closed:
            return
        self._closed = True
        self._fail_all(ClientError("the client is closed"))
        if self._link_fd >= 0 and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._link_fd)
        self._link.close()
        for task in self._tasks:
            task.cancel()
        for pending in self._background:
            pending.cancel()
        self._sock.close(linger=0)

    async def aclose(self) -> None:
        """``close``, then let the reader tasks finish."""
        self.close()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(RequestTimeout("no reply from the server within the timeout"))
