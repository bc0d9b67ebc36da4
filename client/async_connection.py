"""One DEALER connection for asyncio: any number of requests in flight, no future per ZeroMQ message.

A request registers a future under its request id and joins the outgoing queue; once per turn of the event
loop the queue goes out as one message (a BUNDLE when it holds several, each keeping its own id, options
and order), sent without blocking: only a send that finds no server connected (``EAGAIN``) waits, retried
until its ``connect_wait``. One reader callback on the socket's file descriptor receives every reply that is
ready and resolves their futures (the server bundles the replies of one turn to a connection that bundles).
A reply whose caller gave up (timeout or cancellation) goes to ``on_late_reply``, so its resources are
released only then, as in the sync ``Connection``; a request that never went out fails with ``Unsent`` (a
``ConnectionFailed``), and nothing waits for its reply. Not thread-safe: one connection serves one event
loop.

Over 400 lines on purpose: sending, reading, deadlines and streams all move the same four private tables
(waiters, streams, unsent queue, late ids) of one compiled class; split, those tables would become an
interface of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import zmq

from . import async_stream, protocol
from .connection import Unsent
from .curve_keys import CurveKeys
from .deadlines import Deadlines
from .errors import ClientError, ConnectionFailed, ProtocolError, RequestTimeout
from .link_watch import HEARTBEAT_INTERVAL_S, LinkWatch, apply_heartbeats, connect_wait
from .protocol import Command, Frame, Reply, is_final
from .server_check import ServerCheck
from .transport import NOBLOCK, recv_frames, send_messages

log = logging.getLogger(__name__)

_SERVER_CHECK_S = 0.5  # while requests wait, how often to check that a local server is still there
_DRAIN = 1024  # messages the reader handles before it lets other callbacks run
_RETRY_S = 0.002  # while no server is connected, how often the queue tries again
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)

_Item = tuple[Reply, list[Frame]]
_Out = tuple[Command, protocol.OutHeader, Sequence[Frame], str | None, float]  # ..., id, connect deadline


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
        self.heartbeat_interval = heartbeat_interval
        self._on_late = on_late_reply
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # thousands in flight: queue them, never refuse
        self._sock.setsockopt(zmq.RCVHWM, 0)  # and read every reply off the server's queue at once
        apply_heartbeats(self._sock, heartbeat_interval)
        if curve is not None:
            curve.apply(self._sock)
        self._link = LinkWatch(self._sock, url, self._lost)
        # the socket file looked at again only once a connection was made or lost (``ServerCheck``)
        self.server_check = ServerCheck(url[6:] if url.startswith("ipc://") else "", server_uid, self._link)
        self._fds: list[int] = []  # watched by the event loop once one runs this connection
        self._sock.connect(url)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._waiters: dict[str, asyncio.Future[tuple[Reply, list[Frame]]]] = {}
        self._streams: dict[str, asyncio.Queue[_Item | ClientError]] = {}  # decoupled models
        self._watchers: dict[str, Callable[[asyncio.Future[Any]], None]] = {}  # ``send_watched``'s endings
        self._out: list[_Out] = []  # messages for the next flush
        self._flush_handle: asyncio.Handle | None = None
        self._deadlines: Deadlines | None = None  # the requests' timeouts, on one timer
        self._sending: set[str] = set()  # ids not sent yet: not lost with a connection
        self._late: set[str] = set()
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
        self.server_check.check()

    # ------------------------------------------------------------------------------------ requests

    async def request(
        self, command: Command, header: protocol.OutHeader, frames: Sequence[Frame], timeout: float
    ) -> tuple[Reply, list[Frame]]:
        """Send one message and wait up to ``timeout`` seconds for its reply (see ``send`` and ``wait``)."""
        rid = protocol.stamp_id(header, self.new_id())
        fut = self.send(command, header, frames, timeout)
        return await self.wait(rid, fut, timeout)

    def send(
        self, command: Command, header: protocol.OutHeader, frames: Sequence[Frame], timeout: float = math.inf
    ) -> asyncio.Future[tuple[Reply, list[Frame]]]:
        """Queue ``header`` (its ``id`` set) for this turn's send; the future its reply will resolve. It fails
        with ``Unsent`` when the message could not go out (no server connected within ``connect_wait``)."""
        if self._closed:
            raise ClientError("the client is closed")
        loop = self._start()
        rid = protocol.header_id(header)
        fut: asyncio.Future[tuple[Reply, list[Frame]]] = loop.create_future()
        self._waiters[rid] = fut
        self._queue(command, header, frames, rid, timeout)
        return fut

    async def wait(
        self, rid: str, fut: asyncio.Future[tuple[Reply, list[Frame]]], timeout: float
    ) -> tuple[Reply, list[Frame]]:
        """The reply to ``rid``. If the caller gives up first (``RequestTimeout``, ``ConnectionFailed``, or
        the task is cancelled), the reply, if it ever comes, goes to ``on_late_reply``."""
        handle = self._deadlines_of(fut).add(fut, timeout)
        try:
            return await fut
        except Unsent:
            raise
        except BaseException:
            if self._waiters.pop(rid, None) is not None:
                self._late.add(rid)
            elif fut.done() and not fut.cancelled() and fut.exception() is None and self._on_late:
                self._on_late(rid)  # the reply came, but the task was cancelled before it could take it
            raise
        finally:
            if handle is not None:
                handle.cancel()

    def send_watched(
        self,
        command: Command,
        header: protocol.OutHeader,
        frames: Sequence[Frame],
        timeout: float,
        done: Callable[[str, asyncio.Future[tuple[Reply, list[Frame]]]], None],
    ) -> None:
        """``send`` (``header``'s id set) then ``wait`` without a coroutine: ``done(id, future)`` is called
        once the future is resolved: by the reader as the reply is read (in the same turn), or by the loop
        for the error ``wait`` raises (a timeout after ``timeout`` seconds, ``Unsent``, a lost connection).
        As with ``wait``, the reply to a request that failed so goes to ``on_late_reply`` if it ever comes."""
        if self._closed:
            raise ClientError("the client is closed")
        loop = self._start()
        rid = protocol.header_id(header)
        fut: asyncio.Future[tuple[Reply, list[Frame]]] = loop.create_future()
        self._waiters[rid] = fut
        self._queue(command, header, frames, rid, timeout)
        handle = self._deadlines_of(fut).add(fut, timeout)
        watched = functools.partial(self._watched, rid, handle, done)
        fut.add_done_callback(watched)  # every ending but a reply, which calls it at once (``_dispatch_one``)
        self._watchers[rid] = watched

    def _watched(
        self,
        rid: str,
        handle: asyncio.TimerHandle | None,
        done: Callable[[str, asyncio.Future[tuple[Reply, list[Frame]]]], None],
        fut: asyncio.Future[tuple[Reply, list[Frame]]],
    ) -> None:
        """``wait``'s ending for a ``send_watched`` request, then its ``done``."""
        self._watchers.pop(rid, None)
        if handle is not None:
            handle.cancel()
        if fut.cancelled() or (fut.exception() is not None and not isinstance(fut.exception(), Unsent)):
            if self._waiters.pop(rid, None) is not None:  # a timeout, a lost connection: a late reply
                self._late.add(rid)
        done(rid, fut)

    def _deadlines_of(self, fut: asyncio.Future[Any]) -> Deadlines:
        if self._deadlines is None:  # made on the loop of the first request
            self._deadlines = Deadlines(fut.get_loop(), self._time_out)
        return self._deadlines

    def stream(
        self, command: Command, header: protocol.OutHeader, frames: Sequence[Frame], timeout: float
    ) -> AsyncIterator[tuple[Reply, list[Frame]]]:
        """Send one message and yield its replies until the final one; ``timeout`` bounds each wait (the
        async generator is ``async_stream.replies``: a module of its own, so this one can be compiled)."""
        return async_stream.replies(self, command, header, frames, timeout)

    def open_stream(self, header: protocol.OutHeader) -> tuple[str, asyncio.Queue[_Item | ClientError]]:
        """A stream's id (``header``'s, stamped) and the queue its replies go to (``stream``'s first step)."""
        if self._closed:
            raise ClientError("the client is closed")
        self._start()
        rid: str = protocol.stamp_id(header, self.new_id())
        queue: asyncio.Queue[_Item | ClientError] = asyncio.Queue()
        self._streams[rid] = queue
        return rid, queue

    def send_stream(
        self, command: Command, header: protocol.OutHeader, frames: Sequence[Frame], rid: str, timeout: float
    ) -> None:
        """Queue a stream's message (opened by ``open_stream``) for this turn's send."""
        self._queue(command, header, frames, rid, timeout)

    def close_stream(self, rid: str, done: bool) -> None:
        """A stream is over (``done``: its final reply came; else its replies are left to come late)."""
        self._streams.pop(rid, None)
        if not done:
            self._late.add(rid)

    def send_only(self, command: Command, header: protocol.OutHeader) -> None:
        """Send without waiting for the answer (which is then dropped); never blocks, never raises (dropped
        when no server is connected within the heartbeat interval)."""
        if self._closed:
            return
        protocol.stamp_id(header, self.new_id())
        self._start()
        self._queue(command, header, (), None, 0.0)

    # ------------------------------------------------------------------------------------ sending

    def _queue(
        self,
        command: Command,
        header: protocol.OutHeader,
        frames: Sequence[Frame],
        rid: str | None,
        timeout: float,
    ) -> None:
        wait = connect_wait(self.heartbeat_interval, timeout) if rid is not None else self.heartbeat_interval
        self._out.append((command, header, frames, rid, time.monotonic() + wait))
        if rid is not None:
            self._sending.add(rid)
        if self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send the queue: runs of up to MAX_BUNDLE messages (MAX_BUNDLE_FRAMES inline frames) as one
        message each. Every send goes through this socket's one reader: the fd's readiness is checked again
        after it."""
        self._flush_handle = None
        out = self._out
        if not out or self._closed:
            return
        try:  # the link polled first: a loss reported before these requests must not fail them
            self.server_check.check_changed()
        except ConnectionFailed as exc:
            self._fail_unsent(len(out), exc)
            return
        try:
            sent = send_messages(self._sock, [(c, h, f) for c, h, f, _, _ in out])
        except zmq.ZMQError as zmq_exc:
            self._fail_unsent(len(out), ConnectionFailed(f"send failed: {zmq_exc}"))
            return
        self._done_sending(sent)
        if self._out:
            self._expire_unsent()
        if self._out and self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_later(_RETRY_S, self._flush)
        self._on_readable()

    def _done_sending(self, sent: int) -> None:
        for item in self._out[:sent]:
            if item[3] is not None:
                self._sending.discard(item[3])
        del self._out[:sent]

    def _time_out(self, fut: asyncio.Future[Any]) -> None:
        """A call's timeout ran out: one still queued never left (``Unsent``), any other timed out."""
        if self._out:
            self._expire_unsent()
        _expire(fut)

    def _expire_unsent(self) -> None:
        now = time.monotonic()
        keep = [item for item in self._out if item[4] > now]
        if len(keep) == len(self._out):
            return
        gone = [item for item in self._out if item[4] <= now]
        self._out[:] = keep
        self._fail_items(gone, Unsent(f"no connection to a zinfer server at {self.url}"))

    def _fail_unsent(self, count: int, exc: ConnectionFailed) -> None:
        """The first ``count`` queued messages will not go out: their requests fail with ``Unsent``."""
        items = self._out[:count]
        del self._out[:count]
        self._fail_items(items, Unsent(str(exc)))

    def _fail_items(self, items: list[_Out], exc: Unsent) -> None:
        for item in items:
            rid = item[3]
            if rid is None:
                continue
            self._sending.discard(rid)
            fut = self._waiters.pop(rid, None)
            queue = self._streams.get(rid)
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            elif queue is not None:
                queue.put_nowait(exc)
            elif rid in self._late:  # its caller gave up already: nothing will answer it
                self._late.discard(rid)
                if self._on_late is not None:
                    self._on_late(rid)

    # ------------------------------------------------------------------------------------ reader

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._link.poll()  # losses before this loop ran concern no request
            self._fds = [self._link.fd, self._sock.FD]
            loop.add_reader(self._fds[0], self._link.poll)
            loop.add_reader(self._fds[1], self._on_readable)
            if self.url.startswith("ipc://"):
                self._tasks.append(loop.create_task(self._watch()))
        elif loop is not asyncio.get_running_loop():
            raise ClientError("an AsyncClient serves one event loop: make one per loop")
        return loop

    def _on_readable(self) -> None:
        """Every reply that is ready (bounded; the rest in the next turn). ZeroMQ's fd signals edges: it is
        drained until the socket says nothing more is there."""
        if self._closed:
            return
        sock = self._sock
        try:
            for _ in range(_DRAIN):
                if not int(sock.getsockopt(_EVENTS)) & _POLLIN:
                    return
                raw = recv_frames(sock, NOBLOCK)
                try:
                    self._dispatch(raw)
                except Exception:  # one bad reply must not stop the reader every request waits on
                    log.exception("event=reply_dispatch_failed")
            assert self._loop is not None
            self._loop.call_soon(self._on_readable)  # a flood of replies: let the callers run
        except zmq.Again:
            return
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
            replies = protocol.decode_replies([f.buffer for f in raw])
        except ProtocolError as exc:
            log.warning("event=bad_reply error=%r", str(exc))
            return
        for reply, frames in replies:
            self._dispatch_one(reply, frames)

    def _dispatch_one(self, reply: Reply, frames: list[Frame]) -> None:
        rid = reply.request_id
        queue = self._streams.get(rid)
        if queue is not None:
            queue.put_nowait((reply, frames))
            return
        if rid in self._late and not is_final(reply):
            return  # an abandoned stream: only its last response releases what it held
        fut = self._waiters.pop(rid, None)
        if fut is not None and not fut.done():
            watched = self._watchers.pop(rid, None)
            if watched is None:
                fut.set_result((reply, frames))
                return
            # a ``send_watched`` request: answered now, in this turn, not in a callback of the next one
            fut.remove_done_callback(watched)
            fut.set_result((reply, frames))
            try:
                watched(fut)
            except Exception:  # the other replies of this message still go to their callers
                log.exception("event=reply_callback_failed")
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
        """Fail what waits with ``ClientError`` and close the socket (what is still queued is not sent)."""
        if self._closed:
            return
        self._closed = True
        self._fail_all(ClientError("the client is closed"))
        self._out.clear()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self._deadlines is not None:
            self._deadlines.close()
        loop: Any = self._loop  # uvloop's remove_reader returns None, not asyncio's bool (mypyc checks it)
        if loop is not None and not loop.is_closed():
            for fd in self._fds:
                loop.remove_reader(fd)
        self._link.close()
        for task in self._tasks:
            task.cancel()
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
