"""Waiting for the broker's sockets until a deadline finer than a millisecond.

ZeroMQ's poll takes whole milliseconds, and a sleep for the rest would leave the sockets unwatched. So a
wait of a millisecond or more polls for the whole milliseconds (the rest is waited on the next turn), and a
shorter one first polls without waiting, then, when nothing is there, waits in ``select`` (microseconds) on
the ZeroMQ sockets' ``ZMQ_FD`` descriptors, and polls once more. A ``ZMQ_FD`` is edge-triggered: it turns
readable when commands reach the socket's mailbox after the last poll, which is exactly what the poll just
before ``select`` makes sure of. Raw descriptors the poller also watches (the region hand-off's
connections, not on the request path) are left to that next poll, at most a millisecond later; so is
everything when a socket's descriptor is past what ``select`` can take.

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


def tighten_timer_slack(ns: int = 1000) -> bool:
    """Make the calling thread's timer slack ``ns`` nanoseconds (threads it starts later inherit it);
    False where the system has no such setting."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class PreciseWait:
    """``poll(timeout_ms)`` over a ``zmq.Poller`` with sub-millisecond deadlines kept (see the module)."""

    def __init__(self, poller: zmq.Poller) -> None:
        self.poller = poller
        self._fds: dict[int, int] = {}  # id(socket) -> its ZMQ_FD

    def poll(self, timeout_ms: float) -> dict[Any, int]:
        if timeout_ms >= 1.0:
            return dict(self.poller.poll(math.floor(timeout_ms)))
        events = dict(self.poller.poll(0))
        if events or timeout_ms <= 0:
            return events
        fds = self._descriptors()
        if max(fds, default=_SELECT_LIMIT) >= _SELECT_LIMIT:
            return dict(self.poller.poll(1))
        deadline = time.monotonic() + timeout_ms / 1000
        if timeout_ms > _SPIN_MS:
            select.select(fds, [], [], timeout_ms / 1000 - _SPIN_MS / 1000)
        events = dict(self.poller.poll(0))
        while not events and time.monotonic() < deadline:  # the last stretch, where select wakes late
            events = dict(self.poller.poll(0))
        return events

    def _descriptors(self) -> list[int]:
        out = []
        for sock, _ in self.poller.sockets:
            if not isinstance(sock, zmq.Socket):
                continue
            fd = self._fds.get(id(sock))
            if fd is None:
                fd = self._fds[id(sock)] = int(sock.get(zmq.FD))
            out.append(fd)
        return out
