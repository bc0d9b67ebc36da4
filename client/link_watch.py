"""Knowing promptly that the server is gone: ZMTP heartbeats and a socket monitor on the client's DEALER.

A server killed outright leaves its ``ipc://`` socket file behind, and one that is frozen (``SIGSTOP``, a
stuck host) keeps its connections open, so neither the socket file nor a closed connection tells a waiting
client. libzmq's own heartbeats do: the DEALER pings the server every ``interval`` seconds and drops the
connection when no answer came ``interval`` seconds after a ping (the server's libzmq answers pings by
itself, whatever its Python loop is doing). A killed server's connection drops at once. Either way the
socket monitor reports ``EVENT_DISCONNECTED``, and ``LinkWatch.poll`` hands a ``ConnectionFailed`` to the
connection, which fails every call waiting for a reply. libzmq reconnects on its own: a server that comes
back on the same address serves the same client again. ``changes`` counts the connections made and lost
that ``poll`` has read: while it stays the same, the connection is the one there was (``Connection`` checks
the server's socket file again only when it moved).

``poll`` runs once per request, so it asks the monitor's socket ``EVENTS`` (two system calls in libzmq and a
Python enum in pyzmq) only when that socket's ``ZMQ_FD`` is readable: a command (a monitor event's arrival)
reached it since the last look, which read the socket empty and so left it to signal the next one.

``IMMEDIATE`` queues a message only to a completed connection, and drops what a lost connection had not
sent yet: nothing sent while no server is connected is delivered later to the next one. A send therefore
waits for a connection (``connect_wait``) and fails with ``ConnectionFailed`` when none comes.
"""

from __future__ import annotations

import itertools
import select
import struct
import threading
from collections.abc import Callable
from typing import Any

import zmq

from .errors import ConnectionFailed

# The broker's default heartbeat interval (``zinfer serve --heartbeat-interval``): a client learns within
# about two of these that its server is gone.
HEARTBEAT_INTERVAL_S = 1.0
_TTL_INTERVALS = 3  # the server drops a client it has not heard from for this many intervals
_MAX_TTL_MS = 6_553_500  # ZMTP carries the TTL in deciseconds in 16 bits
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_WATCHED = int(zmq.EVENT_CONNECTED) | _DISCONNECTED
_POLLIN = int(zmq.POLLIN)
_ids = itertools.count(1)


def apply_heartbeats(sock: zmq.Socket[Any], interval_s: float) -> None:
    """Set a client DEALER's heartbeat and queueing options (before it connects); ``interval_s <= 0``
    turns the heartbeats off (a killed local server is still noticed at once, a frozen one is not)."""
    sock.setsockopt(zmq.IMMEDIATE, 1)
    if interval_s > 0:
        ivl = max(1, round(interval_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TTL, min(_TTL_INTERVALS * ivl, _MAX_TTL_MS))


def connect_wait(interval_s: float, timeout: float) -> float:
    """How long a send waits for a connection to the server before ``ConnectionFailed``: two heartbeat
    intervals (a server restarting on the same address is reconnected to within 0.1 s), at most the
    call's own ``timeout``."""
    return timeout if interval_s <= 0 else min(timeout, 2 * interval_s)


class LinkWatch:
    """The monitor of one client socket. ``poll`` reads its pending events without blocking and calls
    ``on_lost`` (inside its lock, so no new request slips in between) when the connection was lost.
    Thread-safe; ``fd`` becomes readable when events may be pending (for an event loop's ``add_reader``);
    ``changes``: how many connections made or lost ``poll`` has read."""

    def __init__(self, sock: zmq.Socket[Any], url: str, on_lost: Callable[[ConnectionFailed], None]) -> None:
        self.url = url
        self._on_lost = on_lost
        self._lock = threading.Lock()
        addr = f"inproc://zinfer-link-{next(_ids)}-{id(self):x}"
        self._sock = sock
        sock.monitor(addr, _WATCHED)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pair = ctx.socket(zmq.PAIR)
        self._pair.setsockopt(zmq.LINGER, 0)
        self._pair.connect(addr)
        self._closed = False
        self.changes = 0
        self._signal = select.poll()  # the pair's ZMQ_FD: readable when a command reached the pair
        self._signal.register(self.fd, select.POLLIN)
        self._look = True  # the next poll asks EVENTS whatever the descriptor says

    @property
    def fd(self) -> int:
        return int(self._pair.get(zmq.FD))

    def poll(self) -> None:
        with self._lock:
            if self._closed:
                return
            if not self._look and not self._signal.poll(0):
                return  # nothing reached the pair since it was read empty: no event
            self._look = False
            lost = False
            pair = self._pair
            while int(pair.get(zmq.EVENTS)) & _POLLIN:
                frames = pair.recv_multipart(zmq.NOBLOCK)
                self.changes += 1
                if len(frames[0]) == 6 and struct.unpack("=hi", frames[0])[0] == _DISCONNECTED:
                    lost = True
            if lost:
                self._on_lost(
                    ConnectionFailed(
                        f"lost the connection to the zinfer server at {self.url} (it stopped, or stopped "
                        "answering heartbeats)"
                    )
                )

    def close(self) -> None:
        """Stop the monitor, then close its reading end (before the watched socket is closed). In that order:
        libzmq's I/O thread sends an event (a connection made just now) to the monitor's socket blocking,
        and one with no reader left would block it for good: no socket of the process would connect again."""
        with self._lock:
            self._closed = True
            if not self._sock.closed:
                try:
                    self._sock.disable_monitor()
                except zmq.ZMQError:  # its context is gone: so is the monitor
                    pass
            self._pair.close(linger=0)
