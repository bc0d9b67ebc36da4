"""Triton's scheduler queue: priority levels, each a FIFO with its queue policy. Pure, clock-injected.

Semantics (triton-features.md §1.2; ``core:src/scheduler_utils.cc`` PriorityQueue/PolicyQueue):

* ``priority_levels == 0`` is one queue under ``default_queue_policy``. Otherwise level 1 is served
  first, then level 2, ...; FIFO within a level. A request's priority 0 means ``default_priority_level``;
  a priority outside ``[0, priority_levels]`` raises :class:`InvalidPriority`.
* Each level has a :class:`QueuePolicy`: its own entry in ``priority_queue_policy`` or the default.
  ``max_queue_size`` (0 = unbounded) counts the requests queued at that level; one more raises
  :class:`QueueFull` at once.
* Queue timeout: ``default_timeout_microseconds`` (0 = none). A request's own ``timeout_us`` is used only
  when ``allow_timeout_override`` is set and it is shorter than the default (or the default is 0).
  The timeout runs from the request's ``arrival``; it has passed once ``now >= arrival + timeout``.
* When it passes, ``timeout_action`` REJECT takes the request out (the caller fails it); DELAY moves it
  behind every unexpired request of its level, where it has no timeout any more and may wait
  indefinitely (newer requests of its level still go ahead of it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from zinfer.modelconfig.scheduling import TimeoutAction

from .batch_policy import BatchPolicy, InvalidPriority, QueuedRequest, QueueFull, QueuePolicy

__all__ = ["Entry", "PriorityQueue"]

T = TypeVar("T")

_US_PER_S = 1_000_000


# Entry and _Level are native classes under mypyc, so not generic (a generic dataclass fails there at
# import); Entry, built for every request, has its own __init__ (a dataclass's generated one is interpreted).
@dataclass(slots=True, eq=False, init=False)
class Entry:
    """A queued request with its level (0-based) and absolute queue deadline (``inf`` = none)."""

    request: QueuedRequest
    level: int
    deadline: float
    seq: int
    queued: bool = True

    def __init__(self, request: QueuedRequest, level: int, deadline: float, seq: int) -> None:
        self.request = request
        self.level = level
        self.deadline = deadline
        self.seq = seq
        self.queued = True


@dataclass(slots=True, eq=False)
class _Level:
    policy: QueuePolicy
    main: deque[Entry] = field(default_factory=deque)
    delayed: deque[Entry] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.main) + len(self.delayed)


def _timeout_us(policy: QueuePolicy, requested: int) -> int:
    timeout = policy.default_timeout_microseconds
    if policy.allow_timeout_override and requested > 0 and (timeout == 0 or requested < timeout):
        timeout = requested
    return timeout


class PriorityQueue(Generic[T]):
    """Requests by priority level, FIFO within a level, with queue timeouts. Not thread-safe."""

    def __init__(self, policy: BatchPolicy) -> None:
        self._max_priority = policy.priority_levels
        self._default_level = max(1, policy.default_priority_level)
        count = max(1, policy.priority_levels)
        self._levels: list[_Level] = [_Level(policy.queue_policy(i + 1)) for i in range(count)]
        self._timeouts: list[tuple[float, int, Entry]] = []  # heap; taken entries are skipped lazily
        self._seq = itertools.count()
        self._count = 0
        self._rows = 0

    def __len__(self) -> int:
        return self._count

    @property
    def rows(self) -> int:
        """Total rows queued (sum of batch_size)."""
        return self._rows

    def level_sizes(self) -> tuple[int, ...]:
        """Requests queued at each level, level 1 first."""
        return tuple(len(level) for level in self._levels)

    def level_of(self, priority: int) -> int:
        """The 1-based level a request priority maps to; raises :class:`InvalidPriority`."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidPriority(f"priority must be an int, got {priority!r}")
        if not 0 <= priority <= self._max_priority:
            raise InvalidPriority(
                f"priority {priority} is not in [0, priority_levels={self._max_priority}] "
                "(0 means the model's default priority level)"
            )
        return priority or self._default_level

    def push(self, request: QueuedRequest) -> Entry:
        """Queue ``request`` at the back of its level; raises QueueFull, InvalidPriority, ValueError."""
        level_no = self.level_of(request.priority)
        level = self._levels[level_no - 1]
        requested = request.timeout_us  # an int: QueuedRequest checks that
        if requested < 0:
            raise ValueError(f"request timeout_us must be an int >= 0, got {requested!r}")
        limit = level.policy.max_queue_size
        if limit and len(level) >= limit:
            where = f" at priority level {level_no}" if self._max_priority else ""
            raise QueueFull(f"Exceeds maximum queue size: {len(level)} requests queued{where}, max {limit}")
        timeout = _timeout_us(level.policy, requested)
        deadline = request.arrival + timeout / _US_PER_S if timeout else math.inf
        entry = Entry(request, level_no - 1, deadline, next(self._seq))
        level.main.append(entry)
        if timeout:
            heapq.heappush(self._timeouts, (deadline, entry.seq, entry))
        self._count += 1
        self._rows += request.batch_size
        return entry

    def __iter__(self) -> Iterator[Entry]:
        """Entries in service order: level 1 (unexpired, then delayed), level 2, ..."""
        for level in self._levels:
            yield from level.main
            yield from level.delayed

    def take(self, count: int) -> list[Entry]:
        """Remove and return the first ``count`` entries in service order."""
        out: list[Entry] = []
        for level in self._levels:
            for part in (level.main, level.delayed):
                while part and len(out) < count:
                    out.append(self._drop(part.popleft()))
        self._compact()
        return out

    def next_expiry(self) -> float | None:
        """The earliest queue deadline of a queued request, or None."""
        heap = self._timeouts
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expire(self, now: float) -> tuple[list[Entry], int]:
        """Apply the timeouts due at ``now``: (REJECT entries taken out, number of DELAY entries moved)."""
        due: list[Entry] = []
        heap = self._timeouts
        while heap and (not heap[0][2].queued or heap[0][0] <= now):
            entry = heapq.heappop(heap)[2]
            if entry.queued:
                due.append(entry)
        if not due:
            return [], 0
        due_seqs = {e.seq for e in due}
        rejected: list[Entry] = []
        moved = 0
        for level_no in sorted({e.level for e in due}):
            level = self._levels[level_no]
            kept: deque[Entry] = deque()
            for entry in level.main:
                if entry.seq not in due_seqs:
                    kept.append(entry)
                elif level.policy.timeout_action is TimeoutAction.DELAY:
                    entry.deadline = math.inf
                    level.delayed.append(entry)
                    moved += 1
                else:
                    rejected.append(self._drop(entry))
            level.main = kept
        rejected.sort(key=lambda e: e.seq)
        return rejected, moved

    def remove(self, predicate: Callable[[T], bool]) -> list[Entry]:
        """Take out every entry whose item matches ``predicate``; return them in service order."""
        removed: list[Entry] = []
        for level in self._levels:
            for name in ("main", "delayed"):
                kept: deque[Entry] = deque()
                for entry in getattr(level, name):
                    if predicate(entry.request.item):
                        removed.append(self._drop(entry))
                    else:
                        kept.append(entry)
                setattr(level, name, kept)
        self._compact()
        return removed

    def _drop(self, entry: Entry) -> Entry:
        entry.queued = False
        self._count -= 1
        self._rows -= entry.request.batch_size
        return entry

    def _compact(self) -> None:
        if len(self._timeouts) > 2 * self._count + 64:
            self._timeouts = [t for t in self._timeouts if t[2].queued]
            heapq.heapify(self._timeouts)
