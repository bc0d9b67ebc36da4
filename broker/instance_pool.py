"""The instance pool: which worker serves which model, its places, its batches and its liveness.

Every change to the broker's instance bookkeeping happens here, and nowhere else:

- **workers**: each worker process the supervisor started, by identity, and the model state it serves
  (``add`` at spawn, ``remove`` when its process is reaped);
- **readiness**: a worker becomes an instance of its model when it says READY (``ready``); a model is
  ready with one instance and fully started with ``expected_instances`` (``started``);
- **places**: ``ModelState.idle`` holds one place per instance that can take a batch now. A GPU instance
  that stages the next batch while it computes (``gpu_prefetch``) says READY a second time and gets a
  second place (``second_place``), except in models whose batches must wait for the last one's result
  (sequences) or take turns at resources (rate limiter); an instance whose ``async def execute`` runs
  batches side by side says READY for places up to ``MAX_SLOT`` and gets each (``second_place``);
  ``idle_first`` puts the instances running nothing
  before those second places. A place is taken by a batch (``take``, ``take_next``) and given back by its
  result (``give_back``);
  A CPU or GPU instance of a model that runs every request on its own (no ``dynamic_batching``, no
  sequences, no rate limiter, no execution limit, not decoupled: ``Scheduler.pipelines``) gets a second
  place too: its next request is sent while the current one runs and waits in the worker's socket, so the
  instance never sits idle for a round trip through the broker; no batch is formed differently by it;
  such a model's backlog goes out in runs (its scheduler, picked at load, is ``scheduler.Runs``);
- **in-flight batches**: each batch sent, by batch id, until its result comes (``finish_batch``) or its
  worker dies (``take_batches``);
- **liveness**: the last heartbeat of each worker; ``silent`` names those that stopped (each once).

Pure: no sockets, no ``time.*``; the clock is passed in. The state's ``instances``, ``idle`` and
``prefetching`` stay readable on ``ModelState`` (the batchers and the status read them) but only this
module changes them.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection, Iterable

from .execution_limit import busy_since, overdue
from .model_state import InFlight, ModelState, Pending

STARTUP_GRACE_S = 60.0  # longest a new worker may take to send its first heartbeat


class InstancePool:
    def __init__(self, liveness_s: float, startup_grace_s: float = STARTUP_GRACE_S) -> None:
        """``liveness_s``: how long a worker may be silent once it has heartbeaten; before its first
        heartbeat it may take ``max(liveness_s, startup_grace_s)`` from its start (Python is starting)."""
        self.liveness_s = liveness_s
        self.startup_grace_s = startup_grace_s
        self._owner: dict[bytes, ModelState] = {}
        self._started: dict[bytes, float] = {}
        self._heard: dict[bytes, float] = {}
        self._ever_ready: set[bytes] = set()
        self._inflight: dict[int, InFlight] = {}
        self._batch_ids = itertools.count(1)

    # ------------------------------------------------------------------------------------ workers

    def add(self, worker: bytes, state: ModelState, now: float) -> None:
        """A worker process was started for ``state`` at ``now``."""
        self._owner[worker] = state
        self._started[worker] = now

    def state_of(self, worker: bytes) -> ModelState | None:
        return self._owner.get(worker)

    def workers(self) -> list[bytes]:
        return list(self._owner)

    def workers_of(self, state: ModelState) -> list[bytes]:
        return [w for w, s in self._owner.items() if s is state]

    def remove(self, worker: bytes) -> tuple[ModelState | None, bool]:
        """A worker's process is gone: it leaves the pool with its places. Returns its model state (None
        if it was unknown) and whether it ever said READY. Its batches are taken with ``take_batches``."""
        state = self._owner.pop(worker, None)
        self._started.pop(worker, None)
        self._heard.pop(worker, None)
        ever_ready = worker in self._ever_ready
        self._ever_ready.discard(worker)
        if state is not None:
            state.instances.discard(worker)
            self.withdraw(state, worker)
        return state, ever_ready

    # ------------------------------------------------------------------------------------ liveness

    def heartbeat(self, worker: bytes, now: float) -> bool:
        """A heartbeat from ``worker``; False if it is not a worker of the pool."""
        if worker not in self._owner:
            return False
        self._heard[worker] = now
        return True

    def silent(self, now: float) -> list[tuple[bytes, float]]:
        """The workers whose heartbeats stopped (frozen or wedged), each named once, with how long they
        have been silent."""
        late = []
        for worker in self._owner:
            seen = self._heard.get(worker)
            if seen is not None:
                last, allowed = seen, self.liveness_s
            else:
                last, allowed = self._started[worker], max(self.liveness_s, self.startup_grace_s)
            if now - last > allowed:
                late.append((worker, now - last))
        for worker, _ in late:
            self._heard[worker] = now  # once: reaping follows
        return late

    # ------------------------------------------------------------------------------------ readiness

    def ready(self, worker: bytes) -> ModelState | None:
        """``worker`` said READY: it is an instance of its model with one place. None if unknown."""
        state = self._owner.get(worker)
        if state is None:
            return None
        self._ever_ready.add(worker)
        state.instances.add(worker)
        state.idle.append(worker)
        if state.scheduler.pipelines:  # its next request waits in the worker, not for this one's round trip
            state.idle.append(worker)
            state.prefetching = True
        return state

    def second_place(self, worker: bytes, slot: int = 2) -> bool:
        """``worker`` asked for place number ``slot`` (2: GPU look-ahead; up to ``MAX_SLOT``: an ``async def
        execute`` whose batches run side by side); False where its model gives none. A model whose
        instances pipeline has place 2 already; a further place makes its scheduler send each request
        alone to a free place instead of forming runs (``Scheduler.side_by_side``)."""
        state = self._owner.get(worker)
        if (
            state is None
            or not state.scheduler.eager  # sequences, rate-limited models: a batch waits for the last
            or worker not in state.instances
            or (state.scheduler.pipelines and slot <= 2)  # it has its second place already
        ):
            return False
        state.idle.append(worker)
        state.prefetching = True
        if slot > 2:
            state.scheduler.side_by_side = True
        return True

    @staticmethod
    def started(state: ModelState) -> bool:
        """Every expected instance of ``state`` has said READY."""
        return len(state.instances) >= state.expected_instances

    def retire(self, state: ModelState) -> list[bytes]:
        """``state`` stops serving: its instances and places go; returns the instances to tell to stop."""
        instances = list(state.instances)
        state.instances.clear()
        state.idle.clear()
        return instances

    # ------------------------------------------------------------------------------------ places

    @staticmethod
    def take(state: ModelState, worker: bytes) -> None:
        """One place of ``worker`` is taken by a batch."""
        state.idle.remove(worker)

    @staticmethod
    def take_next(state: ModelState) -> bytes:
        """The next place of ``state`` in line, taken by a batch."""
        return state.idle.popleft()

    @staticmethod
    def give_back(state: ModelState, worker: bytes) -> None:
        """A batch of ``worker`` finished: its place is free again, if it is still an instance."""
        if worker in state.instances:
            state.idle.append(worker)

    @staticmethod
    def withdraw(state: ModelState, worker: bytes) -> None:
        """Every place of ``worker`` goes (it is being killed or is gone): no new batch for it."""
        while worker in state.idle:
            state.idle.remove(worker)

    def idle_first(self, state: ModelState) -> None:
        """Put the instances running nothing before the second places of busy ones (GPU look-ahead): a
        batch waits behind another only when every instance is busy."""
        busy = {b.worker for b in self._inflight.values() if b.model is state}
        if busy:
            state.idle = deque(sorted(state.idle, key=lambda w: w in busy))

    # ------------------------------------------------------------------------------------ batches

    def start_batch(
        self, state: ModelState, worker: bytes, requests: Iterable[Pending], now_ns: int, executions: int = 1
    ) -> InFlight:
        """A batch (or a run of ``executions``) is sent to ``worker`` at ``now_ns`` (monotonic): in flight
        under a new batch id."""
        batch = InFlight(next(self._batch_ids), worker, state, list(requests), now_ns, executions)
        self._inflight[batch.batch_id] = batch
        return batch

    def batch(self, batch_id: int) -> InFlight | None:
        return self._inflight.get(batch_id)

    def drop_batch(self, batch_id: int) -> InFlight | None:
        """The batch leaves the pool without a result (failed, or timed out)."""
        return self._inflight.pop(batch_id, None)

    def finish_batch(self, batch_id: int, worker: bytes) -> InFlight | None:
        """The result of a batch came from ``worker``: the batch, or None when no such batch runs there
        (stale: it was failed already; a batch id named by another worker is dropped all the same)."""
        batch = self._inflight.pop(batch_id, None)
        return batch if batch is not None and batch.worker == worker else None

    def take_batches(self, worker: bytes) -> list[InFlight]:
        """Every batch running on ``worker`` (it died), out of the pool."""
        mine = [b for b in self._inflight.values() if b.worker == worker]
        for b in mine:
            del self._inflight[b.batch_id]
        return mine

    def take_all_batches(self) -> list[InFlight]:
        batches = list(self._inflight.values())
        self._inflight.clear()
        return batches

    def running(self) -> Collection[InFlight]:
        return self._inflight.values()

    def busy(self, state: ModelState) -> bool:
        """Whether a batch of ``state`` is in flight."""
        return any(b.model is state for b in self._inflight.values())

    def busy_since(self) -> dict[bytes, int]:
        """When each busy worker's current batch was sent (monotonic ns); idle workers are absent."""
        return busy_since(self._inflight.values())

    def overdue(self, now_ns: int) -> list[InFlight]:
        """The batches past their model's execution limit at ``now_ns``, one per worker at most."""
        return overdue(self._inflight.values(), now_ns)

