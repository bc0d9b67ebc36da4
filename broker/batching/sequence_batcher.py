"""Triton-style sequence batching: pure, clock-injected, no I/O (triton-features.md §1.4).

A request of a stateful model belongs to a sequence (``sequence_id``, non-zero int or non-empty str) and
carries ``sequence_start`` / ``sequence_end``. :class:`SequenceBatcher` keeps the sequences and their queues:

* A START binds its sequence to the instance with the fewest active sequences; every later request of the
  sequence runs on that instance, in arrival order, one at a time (the next waits for the previous result,
  reported with :meth:`SequenceBatcher.done`).
* A request of an unknown or ended sequence without START raises :class:`SequenceError`. END closes the
  sequence once that request has run. A sequence with nothing queued or running for longer than
  ``max_sequence_idle_microseconds`` is released (:meth:`SequenceBatcher.expire`).
* :meth:`SequenceBatcher.pop_ready` gives each idle instance a batch of at most ``max_batch_size``
  requests, at most one per sequence (:meth:`SequenceBatcher.pop_one`: one batch, to the first of the
  given instances that has one; a turn at the rate limiter). ``direct``: every sequence keeps a slot on
  its instance for its lifetime and rows follow slot order (sequences past ``max_batch_size`` slots wait
  for a free slot).
  ``oldest``: the oldest waiting heads of the instance's sequences, up to ``max_candidate_sequences``.
  An instance waits up to the strategy's ``max_queue_delay_microseconds`` (from its oldest waiting head)
  for every one of its sequences to have a request ready; 0 sends what is ready.

The control inputs (START, END, READY, CORRID) the model receives with each row come from
``zinfer.modelconfig.sequence_batching`` (``control_specs``, ``control_value``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from zinfer.modelconfig.sequence_batching import SequenceBatching

from .batch_policy import BatchReason

__all__ = [
    "SequenceBatch",
    "SequenceBatcher",
    "NotStarted",
    "SequenceError",
    "SequencePolicy",
    "SequenceRequest",
    "parse_sequence",
]

T = TypeVar("T")
I = TypeVar("I", bound=Hashable)  # noqa: E741  an instance handle

SequenceId = int | str

_US_PER_S = 1_000_000


class SequenceError(ValueError):
    """A request that breaks the sequence rules (Triton: INVALID_ARGUMENT)."""


class NotStarted(SequenceError):
    """A request of an unknown or ended sequence without START (Triton's text names the model too)."""

    def __init__(self, sequence_id: SequenceId) -> None:
        self.sequence_id = sequence_id
        super().__init__(
            f"inference request for sequence {sequence_id} must specify the START flag on the first "
            "request of the sequence"
        )


def parse_sequence(params: Any) -> tuple[SequenceId, bool, bool] | None:
    """``(id, start, end)`` from a request's parameters, None when it names no sequence (id 0 or "")."""
    if not isinstance(params, dict):
        return None
    sid = params.get("sequence_id", 0)
    start, end = params.get("sequence_start", False), params.get("sequence_end", False)
    if isinstance(sid, bool) or not isinstance(sid, (int, str)):
        raise SequenceError(f"sequence_id must be an integer or a string, got {sid!r}")
    if isinstance(sid, int) and not 0 <= sid < 1 << 64:
        raise SequenceError(f"sequence_id must be in [0, 2**64), got {sid}")
    for name, flag in (("sequence_start", start), ("sequence_end", end)):
        if not isinstance(flag, bool):
            raise SequenceError(f"{name} must be a boolean, got {flag!r}")
    if sid in (0, ""):
        if start or end:
            raise SequenceError("sequence_start and sequence_end need a non-zero sequence_id")
        return None
    return sid, bool(start), bool(end)


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    max_batch_size: int  # 0 = no batching: one request per batch
    oldest: bool = False  # the strategy: oldest, else direct
    max_queue_delay_us: int = 0
    max_candidate_sequences: int = 0  # oldest: 0 = max_batch_size
    minimum_slot_utilization: float = 0.0  # direct: stop waiting once this share of slots is ready
    max_sequence_idle_us: int = 1_000_000

    @classmethod
    def of(cls, sb: SequenceBatching, max_batch_size: int) -> SequencePolicy:
        if sb.oldest is not None:
            o = sb.oldest
            return cls(max_batch_size, True, o.max_queue_delay_microseconds, o.max_candidate_sequences,
                       0.0, sb.max_sequence_idle_microseconds)  # fmt: skip
        d = sb.direct
        delay, util = (d.max_queue_delay_microseconds, d.minimum_slot_utilization) if d else (0, 0.0)
        return cls(max_batch_size, False, delay, 0, util, sb.max_sequence_idle_microseconds)

    @property
    def width(self) -> int:
        """The most requests in one batch."""
        width = max(1, self.max_batch_size)
        if self.oldest and self.max_candidate_sequences > 0:
            width = min(width, self.max_candidate_sequences)
        return width


@dataclass(frozen=True, slots=True)
class SequenceRequest(Generic[T]):
    item: T
    sequence_id: SequenceId
    start: bool
    end: bool
    arrival: float


@dataclass(frozen=True, slots=True)
class SequenceBatch(Generic[T]):
    """A batch for one instance; ``requests`` in row order (the item of each is ``items``)."""

    requests: tuple[SequenceRequest[T], ...]
    reason: BatchReason

    @property
    def items(self) -> tuple[T, ...]:
        return tuple(r.item for r in self.requests)

    @property
    def size(self) -> int:
        return len(self.requests)


@dataclass(eq=False)
class _Sequence(Generic[T, I]):
    id: SequenceId
    instance: I
    slot: int
    last: float  # the time of its last arrival or result, for the idle timeout
    queue: deque[SequenceRequest[T]] = field(default_factory=deque)
    running: bool = False
    open: bool = True  # false once an END was admitted (and no START after it)


class SequenceBatcher(Generic[T, I]):
    """Sequences, their queues and their batches. Not thread-safe; drive it from one loop."""

    def __init__(self, policy: SequencePolicy) -> None:
        self._policy = policy
        self._delay_s = policy.max_queue_delay_us / _US_PER_S
        self._idle_s = policy.max_sequence_idle_us / _US_PER_S
        self._seqs: dict[SequenceId, _Sequence[T, I]] = {}
        self._count = 0  # queued requests

    @property
    def policy(self) -> SequencePolicy:
        return self._policy

    def __len__(self) -> int:
        return self._count

    def active(self) -> int:
        return len(self._seqs)

    def instance_of(self, sequence_id: SequenceId) -> I | None:
        seq = self._seqs.get(sequence_id)
        return seq.instance if seq is not None else None

    def add(self, request: SequenceRequest[T], now: float, instances: Sequence[I]) -> None:
        """Queue a request; a START binds a new sequence to one of ``instances``. Raises SequenceError."""
        seq = self._seqs.get(request.sequence_id)
        if seq is None or not seq.open:
            if not request.start:
                raise NotStarted(request.sequence_id)
            if seq is None:
                seq = self._bind(request.sequence_id, now, instances)
        seq.queue.append(request)
        seq.open = not request.end
        seq.last = now
        self._count += 1

    def _bind(self, sid: SequenceId, now: float, instances: Sequence[I]) -> _Sequence[T, I]:
        if not instances:
            raise SequenceError("the model has no instance ready for a new sequence")
        per: dict[I, list[int]] = {i: [] for i in instances}
        for s in self._seqs.values():
            if s.instance in per:
                per[s.instance].append(s.slot)
        instance = min(instances, key=lambda i: len(per[i]))  # ties: the first listed
        used = set(per[instance])
        slot = next(n for n in range(len(used) + 1) if n not in used)
        seq: _Sequence[T, I] = _Sequence(sid, instance, slot, now)
        self._seqs[sid] = seq
        return seq

    def done(self, sequence_ids: Sequence[SequenceId], now: float) -> None:
        """The running requests of these sequences finished: the next may go; ended sequences close."""
        for sid in sequence_ids:
            seq = self._seqs.get(sid)
            if seq is None:
                continue
            seq.running = False
            seq.last = now
            if not seq.open and not seq.queue:
                del self._seqs[sid]

    def _compact(self, mine: list[_Sequence[T, I]]) -> None:
        """Direct: move sequences waiting past the last slot into slots that came free, oldest first."""
        width = self._policy.width
        over = sorted((s for s in mine if s.slot >= width), key=lambda s: s.slot)
        if not over:
            return
        free = sorted(set(range(width)) - {s.slot for s in mine})
        for s, slot in zip(over, free, strict=False):
            s.slot = slot

    def _ready(self, instance: I) -> list[_Sequence[T, I]]:
        """The instance's sequences with a request that may go now, in row order."""
        width = self._policy.width
        mine = [s for s in self._seqs.values() if s.instance == instance]
        if not self._policy.oldest:
            self._compact(mine)
        if self._policy.oldest:
            ready = [s for s in mine if s.queue and not s.running]
            ready.sort(key=lambda s: s.queue[0].arrival)
            return ready[:width]
        return sorted((s for s in mine if s.queue and not s.running and s.slot < width), key=lambda s: s.slot)

    def _wanted(self, instance: I) -> int:
        """How many ready rows would make the instance's batch complete."""
        mine = sum(
            1 for s in self._seqs.values() if s.instance == instance and (s.queue or s.running or s.open)
        )
        return max(1, min(self._policy.width, mine))

    def _decide(self, instance: I, now: float) -> tuple[list[_Sequence[T, I]], BatchReason] | None:
        ready = self._ready(instance)
        if not ready:
            return None
        p = self._policy
        if p.max_batch_size == 0:
            return ready[:1], BatchReason.NO_BATCHING
        if len(ready) >= self._wanted(instance):
            return ready, BatchReason.MAX_SIZE
        if self._delay_s == 0:
            return ready, BatchReason.IDLE_NO_DELAY
        if (
            not p.oldest
            and p.minimum_slot_utilization > 0
            and len(ready) >= p.minimum_slot_utilization * p.width
        ):
            return ready, BatchReason.PREFERRED
        if now >= min(s.queue[0].arrival for s in ready) + self._delay_s:
            return ready, BatchReason.DELAY_EXPIRED
        return None

    def pop_ready(self, now: float, idle_instances: Sequence[I]) -> list[tuple[I, SequenceBatch[T]]]:
        """A batch for each idle instance that has one ready at ``now``."""
        out: list[tuple[I, SequenceBatch[T]]] = []
        for instance in idle_instances:
            batch = self._pop(instance, now)
            if batch is not None:
                out.append((instance, batch))
        return out

    def pop_one(self, now: float, instances: Sequence[I]) -> tuple[I, SequenceBatch[T]] | None:
        """The batch of the first of ``instances`` that has one ready at ``now``, or None. For the rate
        limiter: ``instances`` are the idle ones whose resources are free, and one batch is one turn."""
        for instance in instances:
            batch = self._pop(instance, now)
            if batch is not None:
                return instance, batch
        return None

    def _pop(self, instance: I, now: float) -> SequenceBatch[T] | None:
        plan = self._decide(instance, now)
        if plan is None:
            return None
        seqs, reason = plan
        reqs = []
        for s in seqs:
            reqs.append(s.queue.popleft())
            s.running = True
            s.last = now
        self._count -= len(reqs)
        return SequenceBatch(tuple(reqs), reason)

    def next_deadline(self, idle_instances: Sequence[I] = ()) -> float | None:
        """When an idle instance's batch stops waiting for more, or the next idle release; None = never."""
        times: list[float] = []
        if self._delay_s > 0:
            for instance in idle_instances:
                ready = self._ready(instance)
                if ready:
                    times.append(min(s.queue[0].arrival for s in ready) + self._delay_s)
        nxt = self.next_expiry()
        if nxt is not None:
            times.append(nxt)
        return min(times, default=None)

    def next_expiry(self) -> float | None:
        """When the next sequence that sits idle will be released."""
        idle = [s.last for s in self._seqs.values() if not s.queue and not s.running]
        return min(idle) + self._idle_s if idle else None

    def expire(self, now: float) -> list[T]:
        """Release the sequences idle for longer than the limit; no queued request is dropped (none is)."""
        for sid in [s.id for s in self._seqs.values() if not s.queue and not s.running]:
            if now >= self._seqs[sid].last + self._idle_s:
                del self._seqs[sid]
        return []

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Drop queued requests whose item matches; a sequence whose queue empties stays (it may go idle)."""
        out: list[T] = []
        for s in list(self._seqs.values()):
            kept = deque(r for r in s.queue if not predicate(r.item))
            out.extend(r.item for r in s.queue if predicate(r.item))
            s.queue = kept
            if not s.open and not s.queue and not s.running:
                del self._seqs[s.id]
        self._count -= len(out)
        return out

    def drop_instance(self, instance: I) -> list[T]:
        """Forget the sequences bound to a lost instance; return their queued items."""
        out: list[T] = []
        for s in [s for s in self._seqs.values() if s.instance == instance]:
            out.extend(r.item for r in s.queue)
            del self._seqs[s.id]
        self._count -= len(out)
        return out

    def observe_execution(self, batch_size: int, seconds: float, now: float) -> None:
        """For the DynamicBatcher interface; sequence batching does not adapt."""
