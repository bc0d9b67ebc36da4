"""The worker's calls on its DEALER socket, made straight on pyzmq's Cython socket methods.

pyzmq's ``Socket.poll`` builds a ``Poller`` and a dict for one call (~10 µs), where the work itself (one
``zmq_poll``) costs less. The worker asks its socket, before each request of a run and each time a model
asks ``is_cancelled()``, whether a CANCEL is there: these call ``zmq_poll`` themselves, with plain ints, and
receive on the Cython method. Sends go through ``zinfer.client.transport.send_frames``, which skips pyzmq's
Python ``send`` wrapper the same way (``zinfer.client.zmq_calls``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.backend import Socket as _CySocket
from zmq.backend import zmq_poll as _zmq_poll

from zinfer.client.protocol import Frame

__all__ = ["POLLIN", "Waiter", "readable", "recv_buffers"]

POLLIN = int(zmq.POLLIN)
_recv: Callable[..., Any] = _CySocket.recv
zmq_poll: Callable[[Sequence[tuple[Any, int]], int], list[tuple[Any, int]]] = _zmq_poll  # sockets and fds


def recv_buffers(sock: zmq.Socket[Any]) -> list[Frame]:
    """The frames of the next message (waits up to the socket's RCVTIMEO, then ``zmq.Again``): the first
    (the envelope: protocol, command and header, a few hundred bytes) as bytes, the rest as memoryviews
    over libzmq's messages (no copy). ``Frame.more`` says whether more follow (no RCVMORE query)."""
    frame = _recv(sock, 0, False)
    out: list[Frame] = [frame.bytes]
    while frame.more:
        frame = _recv(sock, 0, False)
        out.append(frame.buffer)
    return out


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message can be received from ``sock`` now (one ``zmq_poll``, no wait)."""
    return bool(zmq_poll([(sock, POLLIN)], 0))


class Waiter:
    """One ``zmq_poll`` on the socket and a wake-up descriptor, its item list made once."""

    __slots__ = ("_items", "fd", "sock")

    def __init__(self, sock: zmq.Socket[Any], fd: int) -> None:
        self.sock, self.fd = sock, fd
        self._items: list[tuple[Any, int]] = [(sock, POLLIN), (fd, POLLIN)]

    def wait(self, timeout_ms: int) -> tuple[bool, bool]:
        """Wait up to ``timeout_ms`` for either: (a message is there, the descriptor is readable)."""
        message = woken = False
        for item, _ in zmq_poll(self._items, timeout_ms):
            if item is self.sock:
                message = True
            else:
                woken = True
        return message, woken
