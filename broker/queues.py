"""Queueing: a checked request goes to its model's scheduler, unless the response cache answers it.

``enqueue`` is where every request that passed its checks joins a queue: a client's (``admission``) and an
ensemble step's (``ensemble_path``), made by the broker. A cache hit is answered here (through request
completion); anything else is added to its model's scheduler (``scheduler``), which raises the
``ServerError`` of a request that cannot go in. An ensemble's request is not queued: ``enqueue`` returns
False and the caller starts its steps (``EnsemblePath.start``), so neither caller imports the other's
module for it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable

from zinfer.client.errors import Status, Unavailable
from zinfer.client.protocol import Reply

from .cache_path import CachePath
from .completion import Completion
from .instance_pool import InstancePool
from .model_state import ModelState, Pending
from .registry import ModelRegistry


class Queues:
    def __init__(
        self, registry: ModelRegistry, caching: CachePath, completion: Completion, pool: InstancePool
    ) -> None:
        self.registry = registry
        self.caching = caching
        self.completion = completion  # a cache hit's reply
        self.pool = pool  # whether a batch of the model is in flight (the early dispatch's sign)
        self.seqs = itertools.count(1)  # each request's number: arrival order, its id in its batches

    def enqueue(self, state: ModelState, p: Pending, shape_key: Hashable, now: float) -> bool:
        """Queue a checked request, or answer it from the cache. False: ``state`` is an ensemble and the
        request was not answered from the cache; the caller starts its steps. Raises a ServerError when it
        cannot go in (``p`` is then not queued and not answered)."""
        sched = state.scheduler
        if sched.cacheable and state.config.response_cache.enable and self._cache_lookup(state, p):
            return True
        if sched.plan is not None:
            if state.order is not None:
                state.order.submit(p.seq)
            return False
        try:
            sched.add(p, shape_key, now, sched.needs_busy and self.pool.busy(state))
        except Unavailable:
            state.metrics.rejected()  # a full queue
            raise
        self.registry.has_work(state)
        state.metrics.pending(state.queued)
        if state.order is not None:
            state.order.submit(p.seq)
        return True

    def _cache_lookup(self, state: ModelState, p: Pending) -> bool:
        """Answer ``p`` from the cache if it can (True); on a miss, mark it to be stored when it succeeds."""
        hit = self.caching.lookup(state, p)
        if hit is None:
            return False
        wire, frames, lookup_ns = hit
        if p.trace is not None:
            p.trace.cached = True
        stats = state.stats
        now = time.monotonic()
        duration = int((now - p.arrival) * 1e9) + lookup_ns
        body = {"model": state.name, "version": state.version, "outputs": wire}
        if state.order is not None:
            state.order.submit(p.seq)
        self.completion.reply(state, p, Reply(p.request.request_id, Status.OK, body=body), frames)
        stats.record_success(duration)  # counted once the reply has left
        stats.last_inference_ms = int(time.time() * 1000)
        state.metrics.success(duration / 1000, 0.0, 0)  # a hit is a success, but no inference ran
        state.window.record(now, duration / 1e9)
        return True
