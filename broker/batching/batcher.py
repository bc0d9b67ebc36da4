"""Triton-style dynamic batching policy: pure, clock-injected, no I/O.

The broker loop feeds requests in with :meth:`DynamicBatcher.add`, fails the ones whose queue timeout
passed with :meth:`DynamicBatcher.expire`, and asks for work with :meth:`DynamicBatcher.pop_ready`
whenever model instances are free. Time is always passed in (seconds on the caller's monotonic clock);
nothing here sleeps, logs or reads a clock.

The queue is Triton's priority queue (:mod:`zinfer.broker.batching.priority_queue`: levels, FIFO
within a level, queue timeouts with REJECT/DELAY, ``max_queue_size``). Batch formation follows Triton's
``GetDynamicBatch`` (see triton-features.md §1.3):

* Batches are formed lazily, only when an instance is free, so the queue keeps growing while every
  instance is busy and the next batch is larger.
* The queue is walked in service order (level 1 first, FIFO within a level) from its head. The first
  request fixes the shape key; a request with another shape key cuts the batch (it is never skipped
  over); a request that would push the batch past ``max_batch_size``, or its input bytes past
  ``max_batch_bytes``, ends it (and goes first in the next batch). The largest preferred size
  reached during the walk wins; if the batch would pass the largest preferred size before any preferred
  size was reached it is saturated and goes with what it has.
* The queue delay is measured from the oldest request of the walk, not from when the batch was started.
* Decision: preferred size reached (delay not exceeded) -> that prefix; saturated, shape/size cut or
  largest preferred size reached -> now; ``max_queue_delay_us == 0`` -> whatever is queued; delay
  exceeded -> whatever fits; else wait until :meth:`DynamicBatcher.next_deadline`.
* Early dispatch (``BatchPolicy.early_dispatch``, :mod:`zinfer.broker.batching.early_dispatch`): when the
  model's observed companion rate says no other request is due within the delay, a batch that would wait
  for it goes at once (``EARLY_NO_COMPANION``); under load the timing is Triton's.
* With ``latency_target_us`` set, :mod:`zinfer.broker.batching.adaptive` decides instead of the queue delay
  whether to send what is pending or wait; preferred sizes, cuts and saturation still send at once. It
  learns from :meth:`DynamicBatcher.observe_execution` (batch execution times) and
  :meth:`DynamicBatcher.observe_latencies` (each request's latency, enqueue to result).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .adaptive import AdaptiveController, AdaptiveStats
from .batch_policy import (
    Batch,
    BatchPolicy,
    BatchReason,
    BatchTooLarge,
    InvalidPriority,
    QueuedRequest,
    QueueFull,
)
from .early_dispatch import EarlyDispatch
from .priority_queue import PriorityQueue

__all__ = [
    "Batch",
    "BatchPolicy",
    "BatchReason",
    "BatchTooLarge",
    "BatcherStats",
    "DynamicBatcher",
    "InvalidPriority",
    "QueueFull",
    "QueuedRequest",
]

T = TypeVar("T")

_US_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A snapshot of one batcher, for metrics."""

    queued: int  # requests queued
    queued_rows: int
    level_sizes: tuple[int, ...]  # requests queued per priority level, level 1 first
    rejected_timeouts: int  # REJECT requests whose queue timeout passed (since start)
    delayed_timeouts: int  # DELAY requests moved behind their level
    rejected_queue_full: int  # add() calls refused with QueueFull
    adaptive: AdaptiveStats | None  # None unless latency_target_us is set


@dataclass(frozen=True, slots=True, init=False)
class _Scan:
    """The walk from the queue head to the first cut; depends on the queue only, not on the time.
    (Its own __init__: under mypyc a dataclass's generated one runs as interpreted code.)"""

    count: int  # requests walked
    size: int  # their rows
    cut: BatchReason | None  # why the walk stopped before the queue's end
    pref_count: int  # requests in the prefix of the largest preferred size reached (0 = none)
    pref_size: int
    sat_count: int  # requests before the walk passed the largest preferred size with none reached
    oldest: float  # the oldest arrival among the walked requests

    def __init__(
        self,
        count: int,
        size: int,
        cut: BatchReason | None,
        pref_count: int,
        pref_size: int,
        sat_count: int,
        oldest: float,
    ) -> None:
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "cut", cut)
        object.__setattr__(self, "pref_count", pref_count)
        object.__setattr__(self, "pref_size", pref_size)
        object.__setattr__(self, "sat_count", sat_count)
        object.__setattr__(self, "oldest", oldest)


class DynamicBatcher(Generic[T]):
    """Queue plus Triton's batch-formation rules. Not thread-safe; drive it from one loop."""

    def __init__(self, policy: BatchPolicy) -> None:
        self._policy = policy
        self._max = policy.max_batch_size
        self._max_bytes = policy.max_batch_bytes
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._max_preferred = max(policy.preferred_batch_sizes, default=0)
        self._delay_s = policy.max_queue_delay_us / _US_PER_S
        self._queue: PriorityQueue[T] = PriorityQueue(policy)
        self._adaptive: AdaptiveController | None = None
        if policy.latency_target_us and self._max > 0:
            self._adaptive = AdaptiveController(
                policy.latency_target_us / _US_PER_S, self._max_preferred, policy.instances
            )
        # max_queue_delay as an upper bound: a batch no companion is due for goes at once (early_dispatch)
        self._early: EarlyDispatch | None = None
        if policy.early_dispatch and self._adaptive is None and self._max > 0 and self._delay_s > 0:
            self._early = EarlyDispatch(self._delay_s)
        self._scan: _Scan | None = None  # cache of _walk(); None = stale
        self._trigger_sizes = tuple(sorted({*policy.preferred_batch_sizes, self._max} - {0}))
        self._flip: float | None = None  # the adaptive plan for the cached scan
        self._expired: list[T] = []  # REJECT timeouts found by pop_ready, returned by the next expire()
        self._expired_at: float | None = None
        self._rejected_timeouts = self._delayed_timeouts = self._rejected_full = 0

    @property
    def policy(self) -> BatchPolicy:
        return self._policy

    @property
    def queued_batch_size(self) -> int:
        """Total rows queued (sum of batch_size)."""
        return self._queue.rows

    def __len__(self) -> int:
        return len(self._queue)

    def reached_preferred(self, added_rows: int) -> bool:
        """Whether the request of ``added_rows`` rows just added took the queued rows to or past a
        preferred batch size (or the largest batch): a batch may be ready before the caller's turn ends.
        A hint for when to ask :meth:`pop_ready`, which alone decides."""
        rows = self._queue.rows
        return any(rows - added_rows < size <= rows for size in self._trigger_sizes)

    @property
    def empty(self) -> bool:
        """Nothing queued and no timed-out request waiting for :meth:`expire`."""
        return not self._queue and not self._expired

    @property
    def needs_busy(self) -> bool:
        """Whether :meth:`add` reads its ``busy`` argument (early dispatch on and nothing queued): a caller
        asks the instance pool only then."""
        return self._early is not None and not self._queue

    def add(self, request: QueuedRequest, now: float, busy: bool = False) -> None:
        """Queue a request; the queue delay and timeout run from ``request.arrival``. ``busy``: a batch of
        the model is in flight (with a request already queued, the early dispatch's sign of companions).

        Raises :class:`QueueFull` when its level holds ``max_queue_size`` requests,
        :class:`InvalidPriority` for a priority outside ``[0, priority_levels]``, :class:`BatchTooLarge`
        when its ``nbytes`` alone pass ``max_batch_bytes``, ``ValueError`` for a bad ``batch_size`` or
        ``timeout_us``. A refused request is not queued.
        """
        size = request.batch_size  # an int: QueuedRequest checks that
        if size < 1:
            raise ValueError(f"request batch_size must be an int >= 1, got {size!r}")
        if self._max > 0 and size > self._max:
            raise ValueError(f"request batch_size {size} exceeds max_batch_size {self._max}")
        if self._max_bytes and request.nbytes > self._max_bytes:
            raise BatchTooLarge(
                f"the request's inputs of {request.nbytes} bytes are over the {self._max_bytes} byte "
                "limit of one batch (--max-batch-bytes)"
            )
        overlapping = busy or bool(self._queue)
        try:
            self._queue.push(request)
        except QueueFull:
            self._rejected_full += 1
            raise
        self._scan = None
        if self._early is not None:
            self._early.observe(request.arrival, size, overlapping)
        if self._adaptive is not None:
            self._adaptive.arrivals.observe(request.arrival, size)

    def expire(self, now: float) -> list[T]:
        """Apply queue timeouts due at ``now``; return the REJECT requests taken out, oldest first.

        DELAY requests whose timeout passed move behind the unexpired requests of their level. Call it
        on every loop pass (also while no instance is free) so timeouts are reported promptly.
        """
        self._apply_timeouts(now)
        out, self._expired, self._expired_at = self._expired, [], None
        return out

    def pop_ready(self, now: float, free_instances: int) -> list[Batch]:
        """Form up to ``free_instances`` batches that are ready at ``now``, in service order.

        Stops at the first batch that should still wait: nothing behind it may go. Requests whose
        REJECT timeout has passed are never batched; they are held for the next :meth:`expire`.
        """
        if free_instances < 0:
            raise ValueError(f"free_instances must be >= 0, got {free_instances}")
        self._apply_timeouts(now)
        batches: list[Batch] = []
        while len(batches) < free_instances and self._queue:
            plan = self._plan(now)
            if plan is None:
                break
            batches.append(self._take(now, *plan))
        if self._adaptive is not None and free_instances > len(batches):
            self._adaptive.note_decision(now, self._flip if self._queue else None)
        return batches

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`pop_ready` or :meth:`expire` would act differently.

        That is the minimum of the batch deadline (the oldest walked request's queue delay, or the
        adaptive plan's flip time) and :meth:`next_expiry`. None means nothing waits on time. The batch
        deadline only matters while an instance is free; with none free, wake for :meth:`next_expiry`.
        A time in the past means "due now".
        """
        times = [t for t in (self._batch_deadline(), self.next_expiry()) if t is not None]
        return min(times, default=None)

    def next_expiry(self) -> float | None:
        """The earliest queue timeout of a queued request (or a past time if :meth:`expire` has work)."""
        nxt = self._queue.next_expiry()
        if self._expired_at is not None:
            return self._expired_at if nxt is None else min(nxt, self._expired_at)
        return nxt

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop queued requests whose item matches ``predicate``; return their items in service order.

        Timed-out requests held for :meth:`expire` are included (first), so nothing is lost.
        """
        held: list[T] = []
        kept: list[T] = []
        for item in self._expired:
            (held if predicate(item) else kept).append(item)
        self._expired = kept
        if not kept:
            self._expired_at = None
        removed = self._queue.remove(predicate)
        if removed:
            self._scan = None
        return held + [e.request.item for e in removed]

    def observe_execution(self, batch_size: int, seconds: float, now: float) -> None:
        """Feed the adaptive mode one batch's execution time (dispatch to reply); no-op when it is off."""
        if self._adaptive is not None:
            self._adaptive.exec.observe(batch_size, seconds)
            self._scan = None

    def observe_latencies(self, latencies: Iterable[float], now: float) -> None:
        """Feed the adaptive mode the observed latencies (enqueue to result, seconds) of a batch's requests,
        from which it learns what its estimates miss; no-op when it is off."""
        if self._adaptive is not None:
            changed = [self._adaptive.observe_latency(seconds, now) for seconds in latencies]
            if any(changed):
                self._scan = None

    def stats(self) -> BatcherStats:
        return BatcherStats(
            queued=len(self._queue),
            queued_rows=self._queue.rows,
            level_sizes=self._queue.level_sizes(),
            rejected_timeouts=self._rejected_timeouts,
            delayed_timeouts=self._delayed_timeouts,
            rejected_queue_full=self._rejected_full,
            adaptive=self._adaptive.stats() if self._adaptive is not None else None,
        )

    def _apply_timeouts(self, now: float) -> None:
        rejected, moved = self._queue.expire(now)
        if rejected or moved:
            self._scan = None
            self._delayed_timeouts += moved
            self._rejected_timeouts += len(rejected)
        if rejected:
            self._expired.extend(e.request.item for e in rejected)
            if self._expired_at is None:
                self._expired_at = now

    def _batch_deadline(self) -> float | None:
        if not self._queue or self._max == 0:
            return None
        scan = self._current_scan()
        if self._adaptive is not None:
            return self._flip
        if self._early is not None:
            return self._early.send_at(scan.oldest)
        return scan.oldest + self._delay_s if self._delay_s > 0 else None

    def _current_scan(self) -> _Scan:
        if self._scan is None:
            self._scan = self._walk()
            if self._adaptive is not None:
                self._flip = self._adaptive.plan(self._scan.size, self._scan.oldest)
        return self._scan

    def _walk(self) -> _Scan:
        entries = iter(self._queue)
        head = next(entries).request
        size, count, oldest, nbytes = head.batch_size, 1, head.arrival, head.nbytes
        pref_size, pref_count = (size, 1) if size in self._preferred else (0, 0)
        sat_count = 0
        cut: BatchReason | None = None
        for entry in entries:
            req = entry.request
            new_size = size + req.batch_size
            if req.shape_key != head.shape_key:
                cut = BatchReason.SHAPE_CUT
                break
            if new_size > self._max:
                cut = BatchReason.MAX_SIZE
                break
            if self._max_bytes and nbytes + req.nbytes > self._max_bytes:
                cut = BatchReason.MAX_BYTES
                break
            nbytes += req.nbytes
            if new_size > self._max_preferred and not pref_count and not sat_count:
                sat_count = count  # saturated: no preferred size is reachable any more
            size, count, oldest = new_size, count + 1, min(oldest, req.arrival)
            if size in self._preferred:
                pref_size, pref_count = size, count
        return _Scan(count, size, cut, pref_count, pref_size, sat_count, oldest)

    def _plan(self, now: float) -> tuple[int, BatchReason] | None:
        """How many head requests form the next batch, and why; None means wait."""
        if self._max == 0:
            return 1, BatchReason.NO_BATCHING
        scan = self._current_scan()
        if self._adaptive is not None:
            # Adaptive mode never overrides a preferred size; it only decides when to stop waiting.
            flip = self._flip
            exceeded = False
            send = flip is None or now >= flip
            late = BatchReason.ADAPTIVE_NO_GAIN if flip is None else BatchReason.ADAPTIVE_TARGET
        else:
            # Same expression as next_deadline(), so pop_ready(next_deadline()) always fires.
            exceeded = self._delay_s > 0 and now >= scan.oldest + self._delay_s
            send = exceeded or self._delay_s == 0
            late = BatchReason.DELAY_EXPIRED if exceeded else BatchReason.IDLE_NO_DELAY
            if not send and self._early is not None and self._early.early:
                send, late = True, BatchReason.EARLY_NO_COMPANION  # no companion is due within the delay
        if scan.pref_count and not exceeded:
            full = scan.pref_size == self._max
            return scan.pref_count, BatchReason.MAX_SIZE if full else BatchReason.PREFERRED
        if scan.sat_count and not exceeded:
            return scan.sat_count, BatchReason.MAX_SIZE
        if scan.cut is not None:
            return scan.count, scan.cut
        if scan.size >= self._max_preferred:
            return scan.count, BatchReason.MAX_SIZE
        return (scan.count, late) if send else None

    def _take(self, now: float, count: int, reason: BatchReason) -> Batch:
        entries = self._queue.take(count)
        self._scan = None
        if self._adaptive is not None:
            self._adaptive.record_dispatch(now, (e.request.arrival for e in entries))
        items = tuple(e.request.item for e in entries)
        return Batch(items=items, size=sum(e.request.batch_size for e in entries), reason=reason)
