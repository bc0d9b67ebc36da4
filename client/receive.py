"""Receiving one message's frames without a socket-option query per frame.

pyzmq's ``recv_multipart`` asks the socket ``RCVMORE`` after every frame (a Python-level ``getsockopt``
each time); a frame received without copying already says whether more follow (``Frame.more``, read from
the message itself). With the envelope in one frame, most messages are one or two frames, so this reads
them with one or two receives and no query at all.
"""

from __future__ import annotations

import zmq

__all__ = ["recv_frames"]


def recv_frames(sock: zmq.Socket[bytes], flags: int = 0) -> list[zmq.Frame]:
    """The frames of the next message on ``sock`` (``flags`` apply to the first receive, e.g.
    ``zmq.NOBLOCK``; the rest of a message is already there once its first frame is)."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames
