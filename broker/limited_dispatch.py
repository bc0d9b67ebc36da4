"""The rate limiter on the dispatch path: models whose instance groups name resources take turns at them.

An instance of such a model gets a batch only when its resources are free (``rate_limiter.RateLimiter``);
among the models waiting, the limiter says whose turn it is, and each turn sends one batch (the model's
scheduler, ``scheduler.TakingTurns``, picks it for one of the free places: a sequence model's batch goes
to the instance its sequence is bound to). ``turns`` yields each turn, its place taken and its resources
held, for the dispatcher to send before the next turn is decided. An instance whose group asks for more than
the server has fails its model, and that model's queued requests are answered at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from zinfer.client.errors import Unavailable

from .batching.rate_limiter import RateLimiter, needs_of
from .model_state import ModelState
from .scheduler import AnyBatch

if TYPE_CHECKING:
    from .completion import Completion
    from .instance_pool import InstancePool
    from .supervisor import Supervisor

log = logging.getLogger(__name__)

ModelKey = tuple[str, int, int]  # (name, version, generation): the unit that takes turns at resources


Turn = tuple[ModelState, bytes, list[AnyBatch]]  # a model, the instance its batch goes to, the batch


def model_key(state: ModelState) -> ModelKey:
    return (state.name, state.version, state.generation)


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

    def turns(self, states: list[ModelState], now: float) -> Iterator[Turn]:
        """One batch at a time to the model whose turn it is, on an idle instance whose resources are free:
        each turn's place is taken and its resources held before it is yielded, to be sent at once."""
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
                picked = state.scheduler.pop_ready(now, free)
                if not picked:
                    del by_key[key]
                    break
                worker, batches = picked[0]
                self.pool.take(state, worker)
                limiter.acquire(worker)
                limiter.served(key, limiter.priority_of(worker))
                yield state, worker, batches
                if not (state.idle and state.queued):
                    del by_key[key]
                break
            else:
                return  # nobody could take a turn: wait for resources to come back

    def _register(self, state: ModelState, worker: bytes) -> None:
        """Tell the limiter about an instance: its device and its group's resources and priority."""
        wp = self.supervisor.get(worker)
        instance, device = (wp.spec.instance, wp.spec.device) if wp is not None else (-1, "cpu")
        needs, priority = needs_of(state.group_of(instance))
        error = self.limiter.add(worker, model_key(state), device, needs, priority)
        if error is not None and state.error is None:
            state.error = error
            log.error("event=model_failed model=%s version=%d error=%r", state.name, state.version, error)
            queued = state.scheduler.remove(lambda _: True)
            cannot = Unavailable(f"model '{state.name}' cannot run: {error}")
            for p in queued:
                state.metrics.failure("OTHER")
                self.completion.finish_early(state, p, cannot)
