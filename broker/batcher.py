"""Triton-style dynamic batching policy: pure, clock-injected, no I/O.

The broker loop feeds requests in with :meth:`DynamicBatcher.add` and asks for work with
:meth:`DynamicBatcher.pop_ready` whenever model instances are free.  Time is always passed in
(seconds on the caller's monotonic clock); nothing here sleeps, logs or reads a clock.

Batch formation follows Triton's ``GetDynamicBatch`` (see triton-features.md §1.3):

* Batches are formed lazily, only when an instance is free, so the queue keeps growing while every
  instance is busy and the next batch is larger.
* The queue is walked strictly FIFO from the oldest request.  The first request fixes the shape key;
  a request with another shape key cuts the batch (it is never skipped over); a request that would
  push the batch past ``max_batch_size`` ends it.  The largest preferred size reached during the walk
  wins; if the batch would pass the largest preferred size before any preferred size was reached it
  is saturated and goes with what it has.
* The queue delay is measured from the oldest queued request, not from when the batch was started.
* Decision: preferred size reached (delay not exceeded) -> that prefix; shape/size cut or saturated ->
  now; ``max_queue_delay_us == 0`` -> whatever is queued; delay exceeded -> whatever fits; else wait
  until :meth:`DynamicBatcher.next_deadline`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Batch", "BatchPolicy", "BatchReason", "DynamicBatcher", "QueuedRequest"]

T = TypeVar("T")

_US_PER_S = 1_000_000


class BatchReason(enum.Enum):
    """Why a batch was sent (kept for explainability and metrics)."""

    NO_BATCHING = "no_batching"  # max_batch_size == 0: every request alone
    PREFERRED = "preferred"  # a preferred batch size was reached
    MAX_SIZE = "max_size"  # the next request would pass the size limit, or the batch is full
    SHAPE_CUT = "shape_cut"  # the next request's variable dims differ
    DELAY_EXPIRED = "delay_expired"  # the oldest request waited max_queue_delay
    IDLE_NO_DELAY = "idle_no_delay"  # max_queue_delay is 0: an instance was free, send what is queued


def _require_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Batching knobs, named as in Triton's model config.

    ``preferred_batch_sizes`` is normalised to a sorted, de-duplicated tuple; when empty and batching
    is on it becomes ``(max_batch_size,)`` as Triton does.
    """

    max_batch_size: int  # 0 = no batching
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0

    def __post_init__(self) -> None:
        max_size = _require_count("max_batch_size", self.max_batch_size)
        _require_count("max_queue_delay_us", self.max_queue_delay_us)
        raw: object = self.preferred_batch_sizes
        if not isinstance(raw, (tuple, list)):
            raise ValueError(f"preferred_batch_sizes must be a tuple of ints, got {raw!r}")
        sizes = {_require_count("preferred_batch_sizes entry", s) for s in raw}
        if max_size == 0 and sizes:
            raise ValueError(
                f"preferred_batch_sizes must be empty when max_batch_size is 0 (no batching), got {raw!r}"
            )
        bad = sorted(s for s in sizes if not 1 <= s <= max_size)
        if bad:
            raise ValueError(f"preferred_batch_sizes {bad} outside [1, max_batch_size={max_size}]")
        if not sizes and max_size > 0:
            sizes = {max_size}
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(sizes)))


@dataclass(frozen=True, slots=True)
class QueuedRequest(Generic[T]):
    """One queued request; ``item`` is opaque to the batcher."""

    item: T
    batch_size: int  # rows this request carries; a request with its own batch of N counts N
    shape_key: Hashable  # requests with different keys never share a batch
    arrival: float  # seconds on the caller's monotonic clock


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """A batch to hand to one free instance, items in FIFO order."""

    items: tuple[T, ...]
    size: int  # sum of the requests' batch_size
    reason: BatchReason


class DynamicBatcher(Generic[T]):
    """Queue plus Triton's batch-formation rules. Not thread-safe; drive it from one loop.

    Requests should be added in non-decreasing ``arrival`` order; the head of the queue is taken as
    the oldest request when measuring the queue delay.
    """

    def __init__(self, policy: BatchPolicy) -> None:
        self._policy = policy
        self._max = policy.max_batch_size
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._max_preferred = max(policy.preferred_batch_sizes, default=0)
        self._delay_s = policy.max_queue_delay_us / _US_PER_S
        self._queue: deque[QueuedRequest[T]] = deque()
        self._rows = 0

    @property
    def policy(self) -> BatchPolicy:
        return self._policy

    @property
    def queued_batch_size(self) -> int:
        """Total rows queued (sum of batch_size)."""
        return self._rows

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, request: QueuedRequest[T], now: float) -> None:
        """Queue a request. ``now`` is accepted for symmetry; delay runs from ``request.arrival``."""
        size: object = request.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"request batch_size must be an int >= 1, got {size!r}")
        if self._max > 0 and size > self._max:
            raise ValueError(f"request batch_size {size} exceeds max_batch_size {self._max}")
        self._queue.append(request)
        self._rows += size

    def pop_ready(self, now: float, free_instances: int) -> list[Batch[T]]:
        """Form up to ``free_instances`` batches that are ready at ``now``, oldest first.

        Stops at the first batch that should still wait: with strict FIFO nothing behind it may go.
        """
        if free_instances < 0:
            raise ValueError(f"free_instances must be >= 0, got {free_instances}")
        batches: list[Batch[T]] = []
        while len(batches) < free_instances and self._queue:
            plan = self._plan(now)
            if plan is None:
                break
            batches.append(self._take(*plan))
        return batches

    def next_deadline(self) -> float | None:
        """Time at which the oldest request's queue delay expires, or None if nothing waits on time.

        Only meaningful while an instance is free: with no free instance nothing is sent anyway, and
        the caller should wake on an instance becoming free instead.
        """
        if not self._queue or self._max == 0 or self._delay_s == 0:
            return None
        return self._queue[0].arrival + self._delay_s

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop queued requests whose item matches ``predicate``; return their items in FIFO order."""
        kept: deque[QueuedRequest[T]] = deque()
        removed: list[T] = []
        for req in self._queue:
            if predicate(req.item):
                removed.append(req.item)
                self._rows -= req.batch_size
            else:
                kept.append(req)
        self._queue = kept
        return removed

    def _plan(self, now: float) -> tuple[int, BatchReason] | None:
        """How many head requests form the next batch, and why; None means wait."""
        if self._max == 0:
            return 1, BatchReason.NO_BATCHING
        head = self._queue[0]
        # Same expression as next_deadline(), so pop_ready(next_deadline()) always fires.
        delay_exceeded = self._delay_s > 0 and now >= head.arrival + self._delay_s
        size = count = 0
        pref_size = pref_count = 0
        cut: BatchReason | None = None
        for req in self._queue:
            new_size = size + req.batch_size
            if count:
                if req.shape_key != head.shape_key:
                    cut = BatchReason.SHAPE_CUT
                    break
                if new_size > self._max:
                    cut = BatchReason.MAX_SIZE
                    break
                if new_size > self._max_preferred and not delay_exceeded:
                    if pref_count:
                        break  # no larger preferred size is reachable; the prefix below wins
                    return count, BatchReason.MAX_SIZE  # saturated before any preferred size
            size, count = new_size, count + 1
            if size in self._preferred:
                pref_size, pref_count = size, count
                if size == self._max_preferred and not delay_exceeded:
                    break  # nothing larger is preferred; the walk cannot change the answer
        if pref_count and not delay_exceeded:
            full = pref_size == self._max
            return pref_count, BatchReason.MAX_SIZE if full else BatchReason.PREFERRED
        if cut is not None:
            return count, cut
        if size >= self._max_preferred:
            return count, BatchReason.MAX_SIZE
        if self._delay_s == 0:
            return count, BatchReason.IDLE_NO_DELAY
        if delay_exceeded:
            return count, BatchReason.DELAY_EXPIRED
        return None

    def _take(self, count: int, reason: BatchReason) -> Batch[T]:
        items: list[T] = []
        size = 0
        for _ in range(count):
            req = self._queue.popleft()
            items.append(req.item)
            size += req.batch_size
        self._rows -= size
        return Batch(items=tuple(items), size=size, reason=reason)
