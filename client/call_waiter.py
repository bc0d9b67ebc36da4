"""One call's wait for its reply on a shared sync ``Connection``: where the reply lands, and how its thread
is woken when another thread reads it.

A caller alone on the connection owns the socket and reads its own reply: it never sleeps, so it never
needs a ``threading.Event`` (making one, with its condition and lock, was a tenth of the sync client's CPU
per request). The event is made only when the thread must sleep while another owns the socket; a wake that
comes before it exists leaves a mark (``nudged``) that its next sleep sees. Every field is written, and the
event made, set and cleared, under the connection's waiters lock, so no wake is lost between a look at the
reply and the sleep.
"""

from __future__ import annotations

import threading
from collections import deque

from .errors import ConnectionFailed
from .protocol import Frame, Reply

__all__ = ["Waiter"]


class Waiter:
    def __init__(self, stream: deque[tuple[Reply, list[Frame]]] | None = None) -> None:
        self.event: threading.Event | None = None
        self.reply: Reply | None = None
        self.frames: list[Frame] = []
        self.stream = stream  # several replies (decoupled models)
        self.sent = False  # only a request that went out can be lost with the connection
        self.error: ConnectionFailed | None = None  # the connection was lost, or it never went out
        self.nudged = False  # woken before it had an event: its next sleep returns at once

    def done(self) -> bool:
        return self.error is not None or self.reply is not None or bool(self.stream)

    def wake(self) -> None:
        """Wake its thread (under the waiters lock): set its event, or leave the mark its sleep sees."""
        if self.event is not None:
            self.event.set()
        else:
            self.nudged = True

    def awake(self) -> bool:
        """Woken already, and not asleep again since (under the waiters lock)."""
        return self.nudged or (self.event is not None and self.event.is_set())

    def sleep(self, lock: threading.Lock, timeout: float) -> None:
        """Wait up to ``timeout`` for the reply or a wake (``lock``: the waiters lock, not held)."""
        with lock:
            if self.nudged or self.done():
                self.nudged = False
                return
            event = self.event
            if event is None:
                event = self.event = threading.Event()
        event.wait(timeout)
        with lock:
            if not self.done():
                event.clear()
            self.nudged = False

    def rearm(self, lock: threading.Lock) -> None:
        """A stream's replies taken: its next sleep waits for another (``lock`` not held)."""
        with lock:
            if self.event is not None and not self.stream:
                self.event.clear()
