"""Waiting for the broker's sockets until a deadline finer than a millisecond, on one persistent epoll.

The waiter keeps an ``epoll`` of the ZeroMQ sockets' ``ZMQ_FD`` descriptors and of raw descriptors (the
region hand-off's connections), registered once, instead of building a ``zmq_poll`` set every turn. A
``ZMQ_FD`` is not a message count: it turns readable when commands reach the socket's mailbox, and any use of
the socket (a send, a receive, an ``EVENTS`` query) may take those commands, message arrivals included,
without the descriptor saying so again. So before it sleeps, ``poll`` asks ``EVENTS`` of each socket used
since it last asked (``touched``; the broker's turn sends on and reads from its sockets), and after a wake-up
only of the sockets whose descriptor woke it; a socket that was not used keeps its descriptor's word. With
``recv_first`` it does not ask those either: a socket whose descriptor woke it is returned as it is (``0``,
not ``POLLIN``), and the caller's first receive, without blocking, takes the commands and says whether a
message is there (``EAGAIN``: none). A descriptor wakes for little else than a message's arrival, and a
query of ``EVENTS`` costs two system calls in libzmq and a Python enum in pyzmq (``client.zmq_calls``).

A wait of a millisecond or more sleeps in ``epoll_wait`` for the whole milliseconds (the rest is waited on
the next turn); a shorter one waits in ``select`` (microseconds) on the same descriptors, and polls the last
``_SPIN_MS`` (``select`` wakes up late here). Where a descriptor is past what ``select`` can take, it sleeps a
whole millisecond instead.

Linux lets a sleeping thread wake up to its timer slack late (50 µs by default); ``tighten_timer_slack``
makes it 1 µs for the broker's thread, so a 500 µs queue delay ends at about 500 µs.
"""

from __future__ import annotations

import ctypes
import math
import select
import time
from typing import Any

import zmq

__all__ = ["PreciseWait", "tighten_timer_slack"]

_PR_SET_TIMERSLACK = 29  # prctl(2): this thread's timer slack in nanoseconds
_SPIN_MS = 0.05  # the last 50 µs of a wait are polled for, not slept: select wakes up to ~40 µs late here
_SELECT_LIMIT = 1024  # FD_SETSIZE: select takes no descriptor at or above it
_POLLIN, _EVENTS = int(zmq.POLLIN), int(zmq.EVENTS)  # ints: no enum conversions per call


def tighten_timer_slack(ns: int = 1000) -> bool:
    """Make the calling thread's timer slack ``ns`` nanoseconds (threads it starts later inherit it);
    False where the system has no such setting."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class PreciseWait:
    """``poll(timeout_ms)`` over ZeroMQ sockets and raw descriptors, sub-millisecond deadlines kept (see the
    module; ``recv_first``: a socket whose descriptor woke the wait is returned unasked). Not thread-safe:
    the broker's loop owns it."""

    def __init__(self, recv_first: bool = False) -> None:
        self._recv_first = recv_first
        self._epoll = select.epoll()
        self._sockets: dict[int, zmq.Socket[bytes]] = {}  # ZMQ_FD -> its socket
        self._raw: set[int] = set()
        self._touched: set[zmq.Socket[bytes]] = set()  # used since their EVENTS were last asked

    def register(self, *targets: zmq.Socket[bytes] | int) -> None:
        """Watch ZeroMQ sockets, or raw descriptors, for reading."""
        for target in targets:
            if isinstance(target, zmq.Socket):
                fd = int(target.get(zmq.FD))
                self._sockets[fd] = target
                self._touched.add(target)  # its messages may be there already
            else:
                fd = target
                self._raw.add(fd)
            self._epoll.register(fd, select.EPOLLIN)

    def unregister(self, fd: int) -> None:
        """Stop watching a raw descriptor (before it is closed)."""
        if fd in self._raw:
            self._raw.discard(fd)
            try:
                self._epoll.unregister(fd)
            except OSError:  # closed already: the epoll forgot it then
                pass

    def touch(self, sock: zmq.Socket[bytes]) -> None:
        """``sock`` was used (sent on, read from): ask its EVENTS before the next sleep."""
        self._touched.add(sock)

    def touch_all(self) -> None:
        self._touched.update(self._sockets.values())

    def touch_each(self, socks: list[zmq.Socket[bytes]]) -> None:
        """Each of ``socks`` was used (repeats allowed)."""
        self._touched.update(socks)

    def close(self) -> None:
        self._epoll.close()

    def poll(self, timeout_ms: float) -> dict[Any, int]:
        """What is readable now or within ``timeout_ms``: ``{socket or raw descriptor: POLLIN}``; with
        ``recv_first``, ``{socket: 0}`` for a socket that may be (its descriptor woke the wait)."""
        ready: dict[Any, int] = {}
        for sock in self._touched:
            if int(sock.get(_EVENTS)) & _POLLIN:
                ready[sock] = _POLLIN
        self._touched.clear()
        if ready or timeout_ms <= 0:
            self._collect(self._epoll.poll(0), ready)
            return ready
        if timeout_ms >= 1.0:
            self._collect(self._epoll.poll(math.floor(timeout_ms) / 1000), ready)
            return ready
        fds = [*self._sockets, *self._raw]
        if max(fds, default=_SELECT_LIMIT) >= _SELECT_LIMIT:
            self._collect(self._epoll.poll(0.001), ready)
            return ready
        deadline = time.monotonic() + timeout_ms / 1000
        if timeout_ms > _SPIN_MS:
            select.select(fds, [], [], timeout_ms / 1000 - _SPIN_MS / 1000)
        while True:  # the last stretch, where select wakes late
            self._collect(self._epoll.poll(0), ready)
            if ready or time.monotonic() >= deadline:
                return ready

    def _collect(self, events: list[tuple[int, int]], ready: dict[Any, int]) -> None:
        """Readable descriptors into ``ready``: a raw one as it is, a socket's after asking its EVENTS (with
        ``recv_first``, unasked)."""
        for fd, _ in events:
            sock = self._sockets.get(fd)
            if sock is None:
                ready[fd] = _POLLIN
            elif sock in ready:
                continue
            elif self._recv_first:
                ready[sock] = 0
            elif int(sock.get(_EVENTS)) & _POLLIN:
                ready[sock] = _POLLIN
