"""Sending frames with plain-int flags.

pyzmq's ``send_multipart`` combines its flag enums for every frame, which costs more than the send itself
for small frames; this does the same with ints. Frames of 64 KiB or more go without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from .protocol import COPY_THRESHOLD, Frame

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Frame], flags: int = 0) -> None:
    more = SNDMORE | flags
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        sock.send(frame, more if i < last else flags, copy=len(frame) < COPY_THRESHOLD)
