"""The timeouts of an ``AsyncConnection``'s requests on one timer of the event loop, not one per request.

Most requests of a connection wait as long as each other (the client's ``timeout``), so their deadlines come
in the order they were set: they queue first in, first out, and a single timer of the loop, armed for the
oldest, expires whichever are due when it fires, then arms itself for the next. A request that is answered
in time costs one append (``call_later`` and ``cancel`` per request cost about a tenth of the client's CPU
per request with 32 in flight). A deadline earlier than one queued already (a shorter ``client_timeout``)
gets a timer of its own, as before.

The queue drops answered requests from its front as new ones come; one left waiting (a slow model) keeps
the answered ones behind it until the queue is compacted, which happens when it has doubled since the
last compaction (amortized constant work per request).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

__all__ = ["Deadlines", "Due"]

_COMPACT_MIN = 1024  # entries the queue may hold before it is compacted at all


class Due(Protocol):
    """What a deadline is kept for: a request's future, or what stands in for one (``Watched``)."""

    def done(self) -> bool: ...


class Deadlines:
    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[Due], None]) -> None:
        self._loop = loop
        self._expire = expire  # called with a request's future when its deadline passes unanswered
        self._fifo: deque[tuple[float, Due]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._compact_at = _COMPACT_MIN

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, fut: Due, timeout: float) -> asyncio.TimerHandle | None:
        """``expire(fut)`` ``timeout`` seconds from now, unless ``fut`` is done by then. Returns the timer to
        cancel when ``fut`` has one of its own (its deadline is earlier than one queued), else None."""
        if fut.done():  # answered already (in the turn that sent it): nothing to expire
            return None
        loop = self._loop
        deadline = loop.time() + max(0.0, timeout)
        fifo = self._fifo
        if fifo and deadline < fifo[-1][0]:
            return loop.call_at(deadline, self._expire, fut)
        fifo.append((deadline, fut))
        while fifo[0][1].done():  # stops at the latest, which is not done (checked above)
            fifo.popleft()
        if len(fifo) > self._compact_at:
            self._fifo = fifo = deque(item for item in fifo if not item[1].done())
            self._compact_at = max(_COMPACT_MIN, 2 * len(fifo))
        if self._timer is None:
            self._timer = loop.call_at(fifo[0][0], self._fire)
        return None

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        fifo = self._fifo
        while fifo:
            deadline, fut = fifo[0]
            if not fut.done():
                if deadline > now:
                    break
                self._expire(fut)
            fifo.popleft()
        if fifo:
            self._timer = self._loop.call_at(fifo[0][0], self._fire)

    def close(self) -> None:
        """Forget every deadline (the connection is closed: its requests failed already)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fifo.clear()
