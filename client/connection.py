"""One DEALER connection to a server, shared safely by many threads.

Each call registers a waiter under a fresh request id and puts its message in the outgoing queue (a call
that finds the socket free and the queue empty takes the socket and sends its message itself). One
thread at a time owns the socket (the I/O lock): it sends the whole queue (runs of several messages go as
one BUNDLE, each keeping its own id and order), then reads replies for everyone and wakes their owners. A
thread that finds the socket owned wakes the owner through a pipe the owner polls with the socket, so its
message goes out at once, and waits for its reply; when the owner has its own reply it hands the socket to
a waiting thread. A thread alone blocks in ``recv`` for its reply (``RCVTIMEO`` ``_FAST_RECV_MS``, no poll,
no pipe; one that comes meanwhile waits at most that long). A reply nobody waits for any more (its caller
timed out) goes to ``on_late_reply``, so the caller's resources can be released only then. A message that
cannot go out (no server connected within ``connect_wait``) fails its call with ``Unsent``.

Over 400 lines on purpose: it is one class, and who owns the socket (a lone call sending its own message,
the queue, the owner's rounds, the hand-over, the waiters) runs through every method; split apart, no file
would show which thread may touch the socket when.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import zmq

from . import protocol
from .call_waiter import Waiter
from .curve_keys import CurveKeys
from .errors import ClientError, ConnectionFailed, ProtocolError, RequestTimeout
from .link_watch import HEARTBEAT_INTERVAL_S, LinkWatch, apply_heartbeats, connect_wait
from .protocol import Command, Frame, InferRequest, Reply, is_final
from .server_check import ServerCheck
from .transport import NOBLOCK, recv_buffers, send_frames, send_messages

log = logging.getLogger(__name__)

_SERVER_CHECK_S = 0.5  # while waiting, how often to check that a local server is still there
_OWNER_POLL_S = 0.05  # the longest the socket's owner polls before it looks at its own state again
_WAIT_SLICE_S = 0.005  # how long a thread that does not own the socket sleeps between looks
_FAST_RECV_MS = 2  # how long a thread alone on the connection blocks in recv before it polls instead
_POLLIN, _POLLOUT, _EVENTS = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.EVENTS)


class Unsent(ConnectionFailed):
    """The request never left this client (no server connected in time, or none there): the server never
    saw it, so nothing it holds (shared-memory slots) waits for a reply."""


# a queued message: command, header, frames, its waiter (None: nobody waits), connect deadline
_Out = tuple[Command, protocol.OutHeader, Sequence[Frame], Waiter | None, float]


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
        self.heartbeat_interval = heartbeat_interval
        self._on_late = on_late_reply
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        apply_heartbeats(self._sock, heartbeat_interval)
        self._rcvtimeo = _FAST_RECV_MS  # a lone owner's blocking recv (``_own``)
        self._sock.setsockopt(zmq.RCVTIMEO, self._rcvtimeo)
        if curve is not None:
            curve.apply(self._sock)
        self._waiters_lock = threading.Lock()  # the waiters, the queue and the wake flag
        self._waiters: dict[str, Waiter] = {}
        self._out: list[_Out] = []
        self._link = LinkWatch(self._sock, url, self._lost)
        self.server_check = ServerCheck(url[6:] if url.startswith("ipc://") else "", server_uid, self._link)
        self._sock.connect(url)
        self._io_lock = threading.Lock()  # whoever holds it owns the socket
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._woken = False  # a byte is in the pipe
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._late: set[str] = set()
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid()}-{id(self):x}-"
        self._closed = False

    def close(self) -> None:
        with self._waiters_lock:
            if self._closed:
                return
            self._closed = True
        self._link.close()
        with self._io_lock, self._waiters_lock:
            self._sock.close(linger=0)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)

    def new_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def request(
        self,
        command: Command,
        header: protocol.OutHeader,
        frames: Sequence[Frame],
        timeout: float,
        check: bool = True,
    ) -> tuple[Reply, list[Frame]]:
        """Send one message and wait up to ``timeout`` seconds for its reply.

        The request id is ``header["id"]`` when the caller set one (see ``new_id``), else a fresh one. After
        a ``RequestTimeout`` the reply, if it ever comes, goes to ``on_late_reply`` with that id. ``check``
        False: the caller has just called ``server_check.check_changed()``.
        """
        if self._closed:
            raise ClientError("the client is closed")
        if check:  # it polls the link first: a loss reported before this request must not fail it
            self.server_check.check_changed()
        # an InferRequest carries its id (``Client._track``): no fresh one made for nothing
        rid = (
            header.request_id
            if isinstance(header, InferRequest)
            else protocol.stamp_id(header, self.new_id())
        )
        waiter = Waiter()
        deadline = time.monotonic() + timeout
        # alone at the socket, nothing queued: sent now, no trip through the queue (``_send_now``); a call
        # with no time at all is never sent (``Unsent``, as from the queue)
        owned = timeout > 0 and not self._out and self._io_lock.acquire(False)
        try:
            sent = owned and self._send_now(command, header, frames, waiter, rid)
        except BaseException:  # it could not be encoded: nothing went out, the socket is free again
            self._io_lock.release()
            self._hand_over()
            raise
        if not sent:
            self._queue(command, header, frames, waiter, rid, timeout)
        try:
            self._wait(waiter, deadline, owned)
        except Unsent:
            raise
        except (RequestTimeout, ConnectionFailed):
            with self._waiters_lock:
                if self._waiters.pop(rid, None) is not None:
                    self._late.add(rid)
            raise
        assert waiter.reply is not None
        return waiter.reply, waiter.frames

    def stream(
        self, command: Command, header: protocol.OutHeader, frames: Sequence[Frame], timeout: float
    ) -> Iterator[tuple[Reply, list[Frame]]]:
        """Send one message and yield its replies until the final one; ``timeout`` bounds each wait."""
        if self._closed:
            raise ClientError("the client is closed")
        self.check_server()
        rid = protocol.stamp_id(header, self.new_id())
        waiter = Waiter(stream=deque())
        self._link.poll()
        self._queue(command, header, frames, waiter, rid, timeout)
        try:
            while True:
                while waiter.stream:
                    reply, rframes = waiter.stream.popleft()
                    yield reply, rframes
                    if is_final(reply):
                        return
                waiter.rearm(self._waiters_lock)
                if not waiter.stream:
                    self._wait(waiter, time.monotonic() + timeout)
        finally:
            with self._waiters_lock:
                if self._waiters.pop(rid, None) is not None and waiter.sent:  # abandoned before the end
                    self._late.add(rid)

    def check_server(self) -> None:
        """A local server's socket file is gone when the server is: say so at once instead of timing out.
        A socket made by a user we do not trust, or a symbolic link, is refused (``server_check``)."""
        self.server_check.check()

    def send_only(self, command: Command, header: protocol.OutHeader) -> None:
        """Send without waiting for the answer (which is then dropped); dropped too while no server is
        connected, or once the connection is closed (a stream abandoned after ``close``)."""
        if self._closed:
            return
        protocol.stamp_id(header, self.new_id())
        self._queue(command, header, (), None, "", 0.0)
        if not self._io_lock.acquire(blocking=False):
            self._wake_owner()
            return
        try:
            if not self._closed:
                self._flush()
        finally:
            self._io_lock.release()

    # ------------------------------------------------------------------------------------ the socket

    def _queue(
        self,
        command: Command,
        header: protocol.OutHeader,
        frames: Sequence[Frame],
        waiter: Waiter | None,
        rid: str,
        timeout: float,
    ) -> None:
        wait = connect_wait(self.heartbeat_interval, timeout) if waiter is not None else 0.0
        with self._waiters_lock:
            if waiter is not None:
                self._waiters[rid] = waiter
            self._out.append((command, header, frames, waiter, time.monotonic() + wait))

    def _send_now(
        self,
        command: Command,
        header: protocol.OutHeader,
        frames: Sequence[Frame],
        waiter: Waiter,
        rid: str,
    ) -> bool:
        """Send one call's message at once, by the thread that has just taken the socket with nothing in
        the queue: registered, then sent as ``_flush`` would send it alone. False when it did not go out
        (no server connected yet, the connection closed, or any ZeroMQ error): then it is queued as any
        other (``_queue``), and the owner's round sends it, waits for a server or fails it as ``_flush``
        does."""
        if self._closed:
            return False
        with self._waiters_lock:
            self._waiters[rid] = waiter
        try:
            send_frames(self._sock, protocol.encode(command, header, frames), NOBLOCK)
        except BaseException as exc:  # EAGAIN: no server connected (IMMEDIATE); a ZeroMQ error: queued, as
            with self._waiters_lock:  # a flush would meet it; anything else (encoding) is the caller's
                self._waiters.pop(rid, None)
            if isinstance(exc, zmq.ZMQError):
                return False
            raise
        waiter.sent = True
        return True

    def _wake_owner(self) -> None:
        """Make the socket's owner look at the queue now (it polls the pipe with the socket)."""
        with self._waiters_lock:
            if self._woken or not self._out or self._closed:
                return
            self._woken = True
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: the owner looks soon anyway
                pass

    def _flush(self) -> None:
        """Send the queue (the caller owns the socket): runs as BUNDLEs; what finds no server connected
        waits for the next flush, or fails with ``Unsent`` past its connect deadline. An empty queue is
        seen without the lock: a message queued just after goes out with the next flush, as one queued just
        after the lock would."""
        if not self._out:
            return
        with self._waiters_lock:
            out, self._out = self._out, []
        try:
            sent = send_messages(self._sock, [(c, h, f) for c, h, f, _, _ in out])
        except zmq.ZMQError as exc:
            self._fail_unsent(out, Unsent(f"send failed: {exc}"))
            return
        if sent == len(out):  # the usual case: everything went out
            with self._waiters_lock:
                for item in out:
                    if item[3] is not None:
                        item[3].sent = True
            return
        now = time.monotonic()
        with self._waiters_lock:
            for item in out[:sent]:
                if item[3] is not None:
                    item[3].sent = True
            keep = [item for item in out[sent:] if item[4] > now]
            self._out[:0] = keep
        expired = [item for item in out[sent:] if item[4] <= now]
        if expired:
            self._fail_unsent(expired, Unsent(f"no connection to a zinfer server at {self.url}"))

    def _fail_unsent(self, items: list[_Out], exc: Unsent) -> None:
        with self._waiters_lock:
            for _, header, _, waiter, _ in items:
                if waiter is None:
                    continue
                self._waiters.pop(protocol.header_id(header), None)
                waiter.error = exc
                waiter.wake()

    def _own(self, wait_s: float, fast: bool = False) -> bool:
        """One round as the socket's owner: send the queue, wait up to ``wait_s`` for replies (or a thread
        with a message to send), read them. ``fast``: alone, ``_recv_alone``; True when that got one."""
        self._flush()
        with self._waiters_lock:
            pending = bool(self._out)
            alone = fast and not pending and len(self._waiters) <= 1 and not self._woken
        if alone:
            return self._recv_alone(wait_s)
        if pending:  # no server connected yet: wait until one is, a slice at a time
            self._sock.poll(min(10, max(1, int(wait_s * 1000))), zmq.POLLOUT)
            try:
                self.check_server()
            except ConnectionFailed as exc:  # none there: what waits to go out never will
                with self._waiters_lock:
                    out, self._out = self._out, []
                self._fail_unsent(out, Unsent(str(exc)))
            return False
        events = dict(self._poller.poll(max(1, int(wait_s * 1000))))
        if self._wake_r in events:
            with self._waiters_lock:
                self._woken = False
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        got: list[list[memoryview]] = []
        sock = self._sock
        while len(got) < 1024 and int(sock.getsockopt(_EVENTS)) & _POLLIN:
            got.append(recv_buffers(sock, NOBLOCK))
        self._flush()  # what came in meanwhile goes out before this thread reads replies
        for raw in got:
            self._dispatch(raw)
        return False

    def _recv_alone(self, wait_s: float) -> bool:
        """The owner is the only thread waiting: block in recv (no poll, no pipe) for one message."""
        timeout = max(1, min(_FAST_RECV_MS, int(wait_s * 1000)))
        if timeout != self._rcvtimeo:
            self._rcvtimeo = timeout
            self._sock.setsockopt(zmq.RCVTIMEO, timeout)
        try:
            raw = recv_buffers(self._sock)
        except zmq.Again:
            return False
        self._flush()  # a thread that came meanwhile: its message goes out before replies are read
        self._dispatch(raw)
        return True

    def _hand_over(self) -> None:
        """The owner leaves: wake one thread still waiting, to take the socket (one that registers after
        this look tries the socket itself before it sleeps)."""
        if not self._waiters:
            return
        with self._waiters_lock:
            for w in self._waiters.values():
                if not w.awake():
                    w.wake()
                    return

    def _lost(self, exc: ConnectionFailed) -> None:
        """The connection dropped: every call waiting for a reply fails (``LinkWatch``)."""
        with self._waiters_lock:
            for waiter in self._waiters.values():
                if waiter.sent:
                    waiter.error = exc
                    waiter.wake()

    def _withdraw(self, waiter: Waiter) -> bool:
        """Take a message that is still queued (never sent) out of the queue; False when it is not there
        (sent, or being sent by the socket's owner right now)."""
        with self._waiters_lock:
            for i, item in enumerate(self._out):
                if item[3] is waiter:
                    del self._out[i]
                    self._waiters.pop(protocol.header_id(item[1]), None)
                    return True
        return False

    def _wait(self, waiter: Waiter, deadline: float, owned: bool = False) -> None:
        """Wait for ``waiter``'s reply until ``deadline``: own the socket when it is free and read replies
        for everyone, or sleep while another thread does. ``owned``: the caller holds the I/O lock already
        (``request``): its rounds as the owner come first."""
        next_check = time.monotonic() + _SERVER_CHECK_S
        if owned:
            self._rounds(waiter, deadline, next_check)
        while not waiter.done():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                if self._withdraw(waiter):  # still queued: it never left, no server was there to take it
                    raise Unsent(f"no connection to a zinfer server at {self.url}")
                raise RequestTimeout("no reply from the server within the timeout")
            if now >= next_check:
                next_check = now + _SERVER_CHECK_S
                self.check_server()
            if not self._io_lock.acquire(blocking=False):
                self._wake_owner()
                waiter.sleep(self._waiters_lock, min(remaining, _WAIT_SLICE_S))
                continue
            self._rounds(waiter, deadline, next_check)
        if waiter.error is not None and waiter.reply is None:
            raise waiter.error

    def _rounds(self, waiter: Waiter, deadline: float, next_check: float) -> None:
        """Rounds as the socket's owner (the caller has taken the I/O lock; given back here, however this
        ends) until ``waiter`` is done, ``deadline`` passes or the server is to be checked again."""
        try:
            if self._closed:
                raise ClientError("the client is closed")
            fast = True  # a lone caller blocks in recv first (``_own``)
            while not waiter.done():
                now = time.monotonic()
                if now >= deadline or now >= next_check:
                    break
                fast = self._own(min(deadline - now, _OWNER_POLL_S), fast)
                if not fast:  # nothing came in a recv of its own: look at the link
                    self._link.poll()
        finally:
            self._io_lock.release()
            self._hand_over()

    def _dispatch(self, raw: list[Any]) -> None:
        try:
            replies = protocol.decode_replies(raw)
        except ProtocolError as exc:
            log.warning("event=bad_reply error=%r", str(exc))
            return
        for reply, frames in replies:
            self._dispatch_one(reply, frames)

    def _dispatch_one(self, reply: Reply, frames: list[Frame]) -> None:
        rid = reply.request_id
        with self._waiters_lock:
            waiter = self._waiters.get(rid)
            if waiter is not None:
                if waiter.stream is None:
                    del self._waiters[rid]
                    waiter.frames = frames
                    waiter.reply = reply
                else:
                    if is_final(reply):
                        del self._waiters[rid]
                    waiter.stream.append((reply, frames))
                waiter.wake()
                return
            late = rid in self._late and is_final(reply)
            if late:
                self._late.discard(rid)
        if late and self._on_late is not None:
            self._on_late(rid)
