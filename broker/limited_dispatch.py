"""The rate limiter on the dispatch path: models whose instance groups name resources take turns at them.

An instance of such a model gets a batch only when its resources are free (``rate_limiter.RateLimiter``);
among the models waiting, the limiter says whose turn it is, and each turn sends one batch (a sequence
model's batch goes to the instance its sequence is bound to). An instance whose group asks for more than
the server has fails its model, and that model's queued requests are answered at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from zinfer.client.errors import Unavailable

from .batching.batcher import Batch
from .batching.rate_limiter import RateLimiter, needs_of
from .batching.sequence_batcher import SequenceBatch
from .model_state import ModelState, Pending

if TYPE_CHECKING:
    from .completion import Completion
    from .instance_pool import InstancePool
    from .supervisor import Supervisor

log = logging.getLogger(__name__)

ModelKey = tuple[str, int, int]  # (name, version, generation): the unit that takes turns at resources


def model_key(state: ModelState) -> ModelKey:
    return (state.name, state.version, state.generation)


Execute = Callable[[ModelState, bytes, "Batch[Pending] | SequenceBatch[Pending]", float], None]


class LimitedDispatch:
    def __init__(
        self,
        limiter: RateLimiter[bytes, ModelKey],
        pool: InstancePool,
        supervisor: Supervisor,
        completion: Completion,
    ) -> None:
        self.limiter = limiter
        self.pool = pool
        self.supervisor = supervisor  # an instance's device, for the resources of that device
        self.completion = completion

    def dispatch(self, states: list[ModelState], now: float, execute: Execute) -> None:
        """One batch at a time to the model whose turn it is, on an idle instance whose resources are free;
        ``execute`` sends a batch to an instance (``Dispatcher.execute``)."""
        limiter = self.limiter
        for state in states:
            for worker in state.idle:
                if not limiter.known(worker):
                    self._register(state, worker)
        by_key = {model_key(s): s for s in states if s.error is None}
        while by_key:
            for key in limiter.turn_order(by_key):
                state = by_key[key]
                free = [w for w in state.idle if limiter.can_acquire(w)]
                if not free:
                    continue
                picked = self._pop_one(state, free, now)
                if picked is None:
                    del by_key[key]
                    break
                worker, batch = picked
                self.pool.take(state, worker)
                limiter.acquire(worker)
                limiter.served(key, limiter.priority_of(worker))
                execute(state, worker, batch, now)
                if not (state.idle and state.queued):
                    del by_key[key]
                break
            else:
                return  # nobody could take a turn: wait for resources to come back

    @staticmethod
    def _pop_one(
        state: ModelState, free: list[bytes], now: float
    ) -> tuple[bytes, Batch[Pending] | SequenceBatch[Pending]] | None:
        """One batch of ``state`` for one of its ``free`` instances (a sequence's batch only fits its own)."""
        if state.sequencer is not None:
            return state.sequencer.pop_one(now, free)
        batches = state.batcher.pop_ready(now, 1)
        return (free[0], batches[0]) if batches else None

    def _register(self, state: ModelState, worker: bytes) -> None:
        """Tell the limiter about an instance: its device and its group's resources and priority."""
        wp = self.supervisor.get(worker)
        instance, device = (wp.spec.instance, wp.spec.device) if wp is not None else (-1, "cpu")
        needs, priority = needs_of(state.group_of(instance))
        error = self.limiter.add(worker, model_key(state), device, needs, priority)
        if error is not None and state.error is None:
            state.error = error
            log.error("event=model_failed model=%s version=%d error=%r", state.name, state.version, error)
            queued = state.batcher.remove(lambda _: True)
            if state.sequencer is not None:
                queued += state.sequencer.remove(lambda _: True)
            cannot = Unavailable(f"model '{state.name}' cannot run: {error}")
            for p in queued:
                state.metrics.failure("OTHER")
                self.completion.finish_early(state, p, cannot)
