"""Schedulers: how one model's queued requests become batches on its instances, one kind per model.

A model gets its scheduler once, when it loads (``model_state.scheduler_for``, from its config), and the
broker talks to every kind the same way:

- ``add(p, shape_key, now, busy)`` queues a checked request (admission); a request that cannot go in
  raises the ``ServerError`` its client gets, and is not queued;
- ``pop_ready(now, idle)`` → ``[(instance, batches)]``: what leaves now, each one EXECUTE to one of the
  ``idle`` places, in their order (dispatch); ``batches`` holds one batch, or a run of several;
- ``next_deadline(idle)``: when the next batch or queue timeout falls, given the places free now;
- the queue's upkeep: ``expire`` (queue timeouts), ``remove`` (cancel, withdraw, fail), ``done`` (a batch's
  result came), ``drop_instance`` (an instance died) and ``observe`` (a batch's timings).

The kinds:

- ``Batching``: Triton's dynamic batcher (``batching.batcher``), which is also the default scheduler (no
  ``dynamic_batching``: batches of one request);
- ``Runs``: the default scheduler of a model whose instances take their next request while one runs
  (``instance_pool``'s second place): a backlog goes out in runs, one EXECUTE for several executions
  (``batching.runs``), unless its instances took more places to run batches side by side (an ``async def
  execute``: ``side_by_side``), where each request goes alone to a free place;
- ``Sequences``: sequence batching (``sequence_scheduler``), each sequence bound to one instance;
- ``TakingTurns``: a model whose instance groups name rate-limiter resources, around either of the two
  batching kinds: one batch per turn, for places whose resources are free (``limited_dispatch`` decides
  the turns, across models);
- ``EnsembleSteps``: an ensemble, which queues nothing and has no instances (``ensemble_path`` runs its
  steps as requests to their own models).

Two properties of a kind change how the rest of the broker treats a model's places. ``eager``: an
instance's next batch may leave the moment its place is given back, before the replies of the batch that
ended are built, and a GPU instance may stage a second batch (not for sequences, whose next request waits
for the last one's result, nor for models that take turns at resources). ``takes_turns``: its batches go
only in the turns the rate limiter gives.

Pure: no clock (``now`` is passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from zinfer.client.errors import InternalError, InvalidArgument, ResourceExhausted, Unavailable

from .batching.batcher import (
    Batch,
    BatcherStats,
    BatchPolicy,
    BatchTooLarge,
    DynamicBatcher,
    InvalidPriority,
    QueuedRequest,
    QueueFull,
)
from .batching.runs import ExecutionCost, run_length, run_targets, split_runs
from .batching.sequence_batcher import SequenceBatch
from .ensemble_plan import EnsemblePlan
from .pending import Pending

AnyBatch = Batch | SequenceBatch[Pending]  # a Batch's items are Pending too
Ready = list[tuple[bytes, list[AnyBatch]]]  # (instance, batches): one EXECUTE each


class Scheduler:
    """The shape every kind has; this base queues nothing (an ensemble's, ``EnsembleSteps``)."""

    def __init__(self) -> None:
        self.eager = False  # see the module docstring
        self.takes_turns = False
        self.pipelines = False  # its instances take their next request while one runs (``Runs``)
        self.side_by_side = False  # an instance runs many batches at once (an ``async def execute``)
        self.plan: EnsemblePlan | None = None  # an ensemble's steps
        self.controls: list[dict[str, Any]] = []  # a stateful model's control inputs, added at dispatch
        self.cacheable = True  # the response cache may answer its requests (not a sequence's)

    def __len__(self) -> int:
        """Requests queued."""
        return 0

    def has_work(self) -> bool:
        """Whether the loop must look at the model: requests queued, or sequences to keep or release."""
        return len(self) > 0

    def active(self) -> int:
        """Sequences bound to an instance (only ``Sequences`` has any)."""
        return 0

    @property
    def needs_busy(self) -> bool:
        """Whether ``add`` reads its ``busy`` argument (a caller asks the instance pool only then)."""
        return False

    def add(self, p: Pending, shape_key: Hashable, now: float, busy: bool) -> None:
        raise InternalError("an ensemble's requests run as its steps' requests")

    def ready_now(self, rows: int) -> bool:
        """Whether the request of ``rows`` rows just added may let a batch leave before the turn ends
        (a queue that reached a preferred batch size); a hint, ``pop_ready`` alone decides."""
        return False

    def pop_ready(self, now: float, idle: Sequence[bytes]) -> Ready:
        return []

    def pop_one(self, now: float, free: Sequence[bytes]) -> Ready:
        """At most one batch, for one of ``free`` (one turn at the rate limiter's resources)."""
        return []

    def next_deadline(self, idle: Sequence[bytes]) -> float | None:
        return None

    def next_expiry(self) -> float | None:
        """When ``expire`` next has something to do."""
        return None

    def expire(self, now: float) -> list[Pending]:
        """The requests whose queue timeout passed at ``now``, out of the queue."""
        return []

    def remove(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        """The queued requests ``predicate`` matches, out of the queue."""
        return []

    def done(self, requests: Iterable[Pending], now: float) -> None:
        """A batch of ``requests`` finished (or failed): a sequence may send its next request. Callers may
        skip it for an ``eager`` kind, which waits for no batch's end."""

    def drop_instance(self, instance: bytes) -> list[Pending]:
        """``instance`` died: the queued requests that can go nowhere else."""
        return []

    def observe(self, items: Sequence[Pending], took: float, now: float, compute_ns: int, n: int) -> None:
        """The result of a batch of ``items`` came ``took`` seconds after it was sent, at ``now``;
        ``compute_ns``: the worker's own time for its ``n`` executions."""

    def stats(self) -> BatcherStats | None:
        """The dynamic batcher's figures, for the status (None: no dynamic batcher)."""
        return None


class Batching(Scheduler):
    """Triton's dynamic batcher, and the default scheduler (batches of one request)."""

    def __init__(self, policy: BatchPolicy) -> None:
        super().__init__()
        self.eager = True
        self.batcher: DynamicBatcher[Pending] = DynamicBatcher(policy)

    def __len__(self) -> int:
        return len(self.batcher)

    def has_work(self) -> bool:
        return not self.batcher.empty

    @property
    def needs_busy(self) -> bool:
        return self.batcher.needs_busy

    def add(self, p: Pending, shape_key: Hashable, now: float, busy: bool) -> None:
        # one name per handler: compiled, a name bound by an ``except`` is typed as its first handler's
        # (native) class, and binding another class's error to it raised TypeError (InternalError replies)
        try:  # QueuedRequest checks the types (InvalidPriority), add the ranges
            queued = QueuedRequest(
                p, p.batch_size, shape_key, now, p.request.priority, p.request.timeout_us, p.input_bytes
            )
            self.batcher.add(queued, now, busy)
        except QueueFull as full:
            raise Unavailable(str(full)) from None
        except InvalidPriority as bad:
            raise InvalidArgument(str(bad)) from None
        except BatchTooLarge as large:
            raise ResourceExhausted(str(large)) from None

    def ready_now(self, rows: int) -> bool:
        return self.batcher.reached_preferred(rows)

    def pop_ready(self, now: float, idle: Sequence[bytes]) -> Ready:
        batches = self.batcher.pop_ready(now, len(idle))
        return [(w, [b]) for w, b in zip(idle, batches, strict=False)]

    def pop_one(self, now: float, free: Sequence[bytes]) -> Ready:
        batches = self.batcher.pop_ready(now, 1)
        return [(free[0], [batches[0]])] if batches else []

    def next_deadline(self, idle: Sequence[bytes]) -> float | None:
        return self.batcher.next_deadline() if idle else self.batcher.next_expiry()

    def next_expiry(self) -> float | None:
        return self.batcher.next_expiry()

    def expire(self, now: float) -> list[Pending]:
        return self.batcher.expire(now)

    def remove(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        return self.batcher.remove(predicate)

    def observe(self, items: Sequence[Pending], took: float, now: float, compute_ns: int, n: int) -> None:
        rows = sum(p.batch_size for p in items)
        self.batcher.observe_execution(rows, took, now)
        self.batcher.observe_latencies((now - p.arrival for p in items), now)

    def stats(self) -> BatcherStats | None:
        return self.batcher.stats()


class Runs(Batching):
    """The default scheduler of a model whose instances pipeline: a backlog longer than the free places
    goes out in runs (``batching.runs``), each sized from one execution's measured cost."""

    def __init__(self, policy: BatchPolicy) -> None:
        super().__init__(policy)
        self.pipelines = True
        self.cost = ExecutionCost()  # one execution's time on an instance, from the workers' timings

    def ready_now(self, rows: int) -> bool:
        # the turn's backlog gathers, to go out in runs (unless the instances run requests side by side)
        return self.side_by_side and super().ready_now(rows)

    def pop_ready(self, now: float, idle: Sequence[bytes]) -> Ready:
        """Each instance with a free place takes a run of the backlog; each request goes alone (as the
        batcher gives it) while the queue is no longer than those instances. Instances running nothing
        (both their places free) take the backlog first; a busy one's second place takes a run only while
        no instance is free. Where the instances run their batches side by side (``side_by_side``: more
        places than two), each request goes alone to a free place, runs would only queue them."""
        if self.side_by_side:
            return super().pop_ready(now, idle)
        instances = run_targets(idle)
        queued = len(self.batcher)
        if queued <= len(instances):
            return super().pop_ready(now, idle)
        length = run_length(queued, len(instances), self.cost.ns)
        runs = split_runs(self.batcher.pop_ready(now, length * len(instances)), length)
        return [(w, list(run)) for w, run in zip(instances, runs, strict=False)]

    def observe(self, items: Sequence[Pending], took: float, now: float, compute_ns: int, n: int) -> None:
        self.cost.observe(compute_ns, n)
        super().observe(items, took, now, compute_ns, n)


class TakingTurns(Scheduler):
    """A model whose instance groups name rate-limiter resources: ``inner``'s batches, one per turn."""

    def __init__(self, inner: Scheduler) -> None:
        super().__init__()
        self.inner = inner
        self.takes_turns = True
        self.controls = inner.controls
        self.cacheable = inner.cacheable

    def __len__(self) -> int:
        return len(self.inner)

    def has_work(self) -> bool:
        return self.inner.has_work()

    def active(self) -> int:
        return self.inner.active()

    @property
    def needs_busy(self) -> bool:
        return self.inner.needs_busy

    def add(self, p: Pending, shape_key: Hashable, now: float, busy: bool) -> None:
        self.inner.add(p, shape_key, now, busy)

    def pop_ready(self, now: float, idle: Sequence[bytes]) -> Ready:
        """One turn: ``idle`` are the places whose resources are free; one batch for one of them."""
        return self.inner.pop_one(now, idle) if idle else []

    def pop_one(self, now: float, free: Sequence[bytes]) -> Ready:
        return self.pop_ready(now, free)

    def next_deadline(self, idle: Sequence[bytes]) -> float | None:
        return self.inner.next_deadline(idle)

    def next_expiry(self) -> float | None:
        return self.inner.next_expiry()

    def expire(self, now: float) -> list[Pending]:
        return self.inner.expire(now)

    def remove(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        return self.inner.remove(predicate)

    def done(self, requests: Iterable[Pending], now: float) -> None:
        self.inner.done(requests, now)

    def drop_instance(self, instance: bytes) -> list[Pending]:
        return self.inner.drop_instance(instance)

    def observe(self, items: Sequence[Pending], took: float, now: float, compute_ns: int, n: int) -> None:
        self.inner.observe(items, took, now, compute_ns, n)

    def stats(self) -> BatcherStats | None:
        return self.inner.stats()


class EnsembleSteps(Scheduler):
    """An ensemble: no queue, no instances; ``ensemble_path`` runs ``plan``'s steps."""

    def __init__(self, plan: EnsemblePlan) -> None:
        super().__init__()
        self.plan = plan


__all__ = [
    "AnyBatch",
    "Batching",
    "EnsembleSteps",
    "Ready",
    "Runs",
    "Scheduler",
    "TakingTurns",
]
