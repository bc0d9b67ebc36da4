"""Bytes of replies the broker holds for each client connection that has not read them yet.

libzmq keeps a reply in its queue for the connection (and, zero-copy, the result frames it points into)
until the peer's socket takes it; a client that sends requests and never reads its replies would make the
broker hold every answer (400 requests with 4 MiB outputs: 1.6 GB). Each reply of ``TRACK_MIN`` bytes or
more is therefore sent with a ``MessageTracker`` on its last frame: libzmq writes a connection's messages in
order and releases a message once written, so a tracker that has fired means the whole message has left.
What the unfired trackers of a connection count is what it holds, and ``limit`` bounds it: the broker
refuses the connection's new requests while it is at the limit, and replaces a reply that would pass it
by a small error (``ResourceExhausted``) naming the limit. Smaller replies are not counted: libzmq's
high-water mark (1000 messages a connection) bounds those.
"""

from __future__ import annotations

from collections import deque

import zmq

DEFAULT_MAX_UNREAD_REPLY_BYTES = 256 << 20
TRACK_MIN = 64 << 10  # replies of this many bytes or more are tracked (the zero-copy ones)


class ReplyBacklog:
    """Per connection: the tracked replies not yet written out, oldest first, and their bytes."""

    def __init__(self, limit: int = DEFAULT_MAX_UNREAD_REPLY_BYTES) -> None:
        self.limit = limit  # 0: no limit (nothing is tracked)
        self._sent: dict[bytes, deque[tuple[zmq.MessageTracker, int]]] = {}
        self._bytes: dict[bytes, int] = {}

    def tracks(self, nbytes: int) -> bool:
        """Whether a reply of ``nbytes`` is to be sent with a tracker."""
        return bool(self.limit) and nbytes >= TRACK_MIN

    def add(self, identity: bytes, tracker: zmq.MessageTracker, nbytes: int) -> None:
        self._sent.setdefault(identity, deque()).append((tracker, nbytes))
        self._bytes[identity] = self._bytes.get(identity, 0) + nbytes

    def held(self, identity: bytes) -> int:
        """Bytes of replies to ``identity`` that libzmq still holds."""
        sent = self._sent.get(identity)
        if sent is None:
            return 0
        left = self._bytes[identity]
        while sent and sent[0][0].done:
            left -= sent.popleft()[1]
        if not sent:
            del self._sent[identity], self._bytes[identity]
            return 0
        self._bytes[identity] = left
        return left

    def full(self, identity: bytes) -> bool:
        """Whether the connection holds ``limit`` bytes or more: its new requests are refused."""
        return bool(self.limit) and self.held(identity) >= self.limit

    def prune(self) -> None:
        """Forget what has left, for every connection (a connection that is gone has its queue dropped by
        libzmq, which fires its trackers)."""
        for identity in list(self._sent):
            self.held(identity)

    def connections(self) -> int:
        """Connections with tracked replies not yet written out."""
        return len(self._sent)
