"""Reading what one of the broker's sockets has, a bounded number of messages per turn.

The first receive does not block and takes ``EAGAIN`` as nothing there: the loop's waiter returns a socket
whose descriptor woke it without asking its ``EVENTS`` (``PreciseWait(recv_first=True)``), and a descriptor
wakes for little else than a message. After each message ``EVENTS`` says whether another is there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from zinfer.client.protocol import Frame
from zinfer.client.transport import NOBLOCK, recv_frames
from zinfer.client.zmq_calls import EVENTS, POLLIN

__all__ = ["MAX_PER_TURN", "drain"]

MAX_PER_TURN = 256  # messages from one socket per turn: the others and the batch deadlines wait no longer


def drain(sock: zmq.Socket[Any], on: Callable[[bytes, list[Frame]], None], tag: bytes) -> bool:
    """Hand each message on ``sock`` to ``on`` (its identity frame after ``tag``, the other frames' buffers);
    True when messages are left (``MAX_PER_TURN``), False when ``EVENTS`` was just asked or none was there."""
    try:
        frames = recv_frames(sock, NOBLOCK)
    except zmq.Again:
        return False
    for _ in range(MAX_PER_TURN - 1):
        on(tag + frames[0].bytes, [f.buffer for f in frames[1:]])
        if not int(sock.get(EVENTS)) & POLLIN:
            return False
        frames = recv_frames(sock)
    on(tag + frames[0].bytes, [f.buffer for f in frames[1:]])
    return True
