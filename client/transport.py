"""Sending frames with plain-int flags, queues of messages as BUNDLEs, and receiving a message's frames.

pyzmq's ``send_multipart`` combines its flag enums for every frame, which costs more than the send itself
for small frames; this does the same with ints, through pyzmq's Cython ``send`` itself (``zmq_calls``). Frames
of 64 KiB or more go without a copy.

pyzmq's ``recv_multipart`` asks the socket ``RCVMORE`` after every frame (a Python-level ``getsockopt``);
``recv_frames`` reads ``Frame.more`` of each frame received without copying instead (the message itself
says whether more follow). With the envelope in one frame most messages are one or two frames.
``recv_buffers`` gives their buffers (what the decoders read), through pyzmq's Cython ``recv`` called
directly (``zmq_calls``) on a socket of pyzmq's plain class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import zmq

from . import protocol, zmq_calls
from .protocol import COPY_THRESHOLD, MAX_BUNDLE, MAX_BUNDLE_FRAMES, Command, Frame

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
# ``zmq_calls``' class test and calls, held here: that module is interpreted, so asking it per message
# (``zmq_calls.fast(sock)``, ``zmq_calls.send``) ran its Python each time. ``type(sock) is _PLAIN``: ``fast``
_PLAIN: Final = zmq_calls.PLAIN
_SEND: Final = zmq_calls.send
_RECV: Final = zmq_calls.recv


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Frame], flags: int = 0) -> None:
    more = SNDMORE | flags
    last = len(frames) - 1
    if type(sock) is _PLAIN:  # pyzmq's Cython send, without its Python wrapper (``zmq_calls.fast``)
        send = _SEND
        for i, frame in enumerate(frames):
            send(sock, frame, more if i < last else flags, len(frame) < COPY_THRESHOLD)
        return
    for i, frame in enumerate(frames):
        sock.send(frame, more if i < last else flags, copy=len(frame) < COPY_THRESHOLD)


def send_messages(
    sock: zmq.Socket[Any], items: Sequence[tuple[Command, protocol.Header, Sequence[Frame]]]
) -> int:
    """Send ``items`` in order without blocking, runs of several as one BUNDLE (MAX_BUNDLE messages,
    MAX_BUNDLE_FRAMES inline frames at most); how many went out before the socket had no peer to take them
    (``EAGAIN``). Other ZeroMQ errors raise."""
    sent = 0
    total = len(items)
    try:
        while sent < total:
            end, frames = sent, 0
            while end < total and end - sent < MAX_BUNDLE:
                n = len(items[end][2])
                if end > sent and frames + n > MAX_BUNDLE_FRAMES:
                    break
                frames += n
                end += 1
            if end - sent == 1:
                msg = protocol.encode(*items[sent])
            else:
                msg = protocol.encode_bundle(items[sent:end])
            send_frames(sock, msg, NOBLOCK)  # libzmq takes every frame once the first is in
            sent = end
    except zmq.Again:
        pass
    return sent


def recv_buffers(sock: zmq.Socket[Any], flags: int = 0) -> list[memoryview]:
    """The buffers of the next message's frames on ``sock`` (as ``recv_frames``; each keeps its frame)."""
    if type(sock) is not _PLAIN:  # (``zmq_calls.fast``)
        return [f.buffer for f in recv_frames(sock, flags)]
    recv = _RECV
    frame = recv(sock, flags, False)
    out = [frame.buffer]
    while frame.more:
        frame = recv(sock, 0, False)
        out.append(frame.buffer)
    return out


def recv_frames(sock: zmq.Socket[Any], flags: int = 0) -> list[zmq.Frame]:
    """The frames of the next message on ``sock`` (``flags`` apply to the first receive, e.g. ``NOBLOCK``:
    the rest of a message is there once its first frame is)."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames
