"""One DEALER connection for asyncio: any number of requests in flight, no future per ZeroMQ message.

A request registers a future under its request id and joins the outgoing queue; once per turn of the event
loop the queue goes out as one message (a BUNDLE when it holds several, each keeping its own id, options
and order), sent without blocking: only a send that finds no server connected (``EAGAIN``) waits, retried
until its ``connect_wait``. One reader callback on the socket's file descriptor receives every reply that is
ready and resolves their futures (the server bundles the replies of one turn to a connection that bundles);
a ``send_watched`` request (the HTTP door's direct path) has no future: a ``Watched`` is resolved in its place
and its callback called at once.
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
from .deadlines import Deadlines, Due
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


class Watched:
    """The outcome of a ``send_watched`` request, as ``done`` is given it: what a future of it would say
    (``result``, ``exception``, ``done``, ``cancelled``), without the future. A future per request, its done
    callback and the partial that binds it cost about 1.5 µs of the door's CPU per request (compiled,
    uvloop); the connection resolves this at once instead, and its deadline is kept on the same timer."""

    def __init__(self, rid: str, done: Callable[[str, Watched], None], context: Any = None) -> None:
        self.rid = rid
        self.context = context  # the caller's, for ``done`` (one callback for every request, no partial)
        self._done = done
        self._handle: asyncio.TimerHandle | None = None  # a deadline earlier than those queued: its own timer
        self._item: _Item | None = None
        self._exc: BaseException | None = None
        self._finished = False

    def done(self) -> bool:
        return self._finished

    def cancelled(self) -> bool:
        return False  # nothing cancels it: its endings are a reply, a timeout, Unsent and a lost connection

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> _Item:
        if self._exc is not None:
            raise self._exc
        assert self._item is not None, "not done yet"
        return self._item

    def _end(self, item: _Item | None, exc: BaseException | None) -> None:
        """Resolved: ``done`` is called with it, once."""
        self._finished = True
        self._item, self._exc = item, exc
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._done(self.rid, self)


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
        self._watched: dict[str, Watched] = {}  # ``send_watched``'s requests waiting for a reply
        self._out: list[_Out] = []  # messages for the next flush
        self._flush_handle: asyncio.Handle | None = None
        self._deadlines: Deadlines | None = None  # the requests' timeouts, on one timer
        self._late: set[str] = set()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}-"
        self._closed = False

    @property
    def in_flight(self) -> int:
        return len(self._waiters) + len(self._watched)

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
        handle = self._deadlines_of(fut.get_loop()).add(fut, timeout)
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
        done: Callable[[str, Watched], None],
        context: Any = None,
    ) -> None:
        """``send`` (``header``'s id set) then ``wait`` without a coroutine or a future: ``done(id, watched)``
        is called once the request ends, with a ``Watched`` that says how as a future would: by the reader
        as the reply is read (in the same turn), or for the error ``wait`` raises (a timeout after
        ``timeout`` seconds, ``Unsent``, a lost connection, the connection closed). As with ``wait``, the
        reply to a request that failed so goes to ``on_late_reply`` if it ever comes. ``context``: kept as
        ``watched.context``."""
        if self._closed:
            raise ClientError("the client is closed")
        loop = self._start()
        rid = protocol.header_id(header)
        watched = Watched(rid, done, context)
        self._watched[rid] = watched
        self._queue(command, header, frames, rid, timeout)
        watched._handle = self._deadlines_of(loop).add(watched, timeout)

    def _fail_watched(self, rid: str, exc: BaseException) -> bool:
        """End a ``send_watched`` request with ``exc`` (False: none is waiting under ``rid``). Its reply, if
        one comes, goes to ``on_late_reply`` unless it was never sent (``Unsent``)."""
        watched = self._watched.pop(rid, None)
        if watched is None:
            return False
        if not isinstance(exc, Unsent):
            self._late.add(rid)
        try:
            watched._end(None, exc)
        except Exception:  # the other requests still end
            log.exception("event=reply_callback_failed")
        return True

    def _deadlines_of(self, loop: asyncio.AbstractEventLoop) -> Deadlines:
        if self._deadlines is None:  # made on the loop of the first request
            self._deadlines = Deadlines(loop, self._time_out)
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
        del self._out[:sent]
        if self._out:
            self._expire_unsent()
        if self._out and self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_later(_RETRY_S, self._flush)
        self._on_readable()

    def _time_out(self, due: Due) -> None:
        """A call's timeout ran out: one still queued never left (``Unsent``), any other timed out."""
        if self._out:
            self._expire_unsent()
        if isinstance(due, Watched):  # (one that ended is no longer waiting: nothing happens)
            self._fail_watched(due.rid, RequestTimeout("no reply from the server within the timeout"))
        elif isinstance(due, asyncio.Future):
            _expire(due)

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
            if self._fail_watched(rid, exc):
                continue
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
        watched = self._watched.pop(rid, None)
        if watched is not None:  # a ``send_watched`` request: answered now, in this turn
            try:
                watched._end((reply, frames), None)
            except Exception:  # the other replies of this message still go to their callers
                log.exception("event=reply_callback_failed")
            return
        fut = self._waiters.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result((reply, frames))
        elif fut is not None or rid in self._late:  # its caller gave up already
            self._late.discard(rid)
            if self._on_late is not None:
                self._on_late(rid)

    def _fail_all(self, exc: ClientError, spare: set[str] | frozenset[str] = frozenset()) -> None:
        """Fail every request waiting for a reply (and every stream), except those in ``spare``."""
        for rid, fut in list(self._waiters.items()):
            if not fut.done() and rid not in spare:
                fut.set_exception(exc)
        for rid in [r for r in self._watched if r not in spare]:
            self._fail_watched(rid, exc)
        for rid, queue in list(self._streams.items()):
            if rid not in spare:
                queue.put_nowait(exc)

    def _lost(self, exc: ConnectionFailed) -> None:
        """The connection dropped (``LinkWatch``): what went out on it will not be answered; what is still
        queued (not sent yet) goes on the next connection."""
        self._fail_all(exc, {item[3] for item in self._out if item[3] is not None})

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
