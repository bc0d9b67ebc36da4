"""A virtual-time simulation of the broker's batching loop, for tests and benchmarks. Pure, seeded.

:func:`simulate` drives a :class:`~zinfer.broker.batching.batcher.DynamicBatcher` the way the broker does
(add on arrival, ``expire`` and ``pop_ready`` on every event, ``observe_execution`` and ``observe_latencies``
after every batch, wake at ``next_deadline`` while an instance is free and at ``next_expiry`` otherwise)
against an execution-time model, with no clock and no sleeping. ``hidden_s`` adds time the batcher is
not told of (a batch takes ``exec_time + hidden_s`` but ``observe_execution`` hears ``exec_time``): what
CPU contention or a late loop adds in a real server; only the observed latencies show it.
:func:`poisson_arrivals` makes a seeded open-loop arrival stream.

Example: a static delay against the adaptive mode at 3000 requests/s on one instance::

    arrivals = poisson_arrivals(3000.0, 5000, seed=1)
    model = ExecModel(fixed_s=1e-3, per_item_s=1e-4)
    static = simulate(BatchPolicy(32, max_queue_delay_us=500), arrivals, model)
    adaptive = simulate(BatchPolicy(32, latency_target_us=10_000), arrivals, model)
    print(static.p99, adaptive.p99, static.throughput, adaptive.throughput)
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from .batcher import (
    Batch,
    BatcherStats,
    BatchPolicy,
    DynamicBatcher,
    InvalidPriority,
    QueuedRequest,
    QueueFull,
)

__all__ = ["ExecModel", "SimRequest", "SimResult", "poisson_arrivals", "simulate"]


@dataclass(frozen=True, slots=True)
class ExecModel:
    """Execution seconds of a batch: ``fixed_s + per_item_s * rows``."""

    fixed_s: float
    per_item_s: float

    def __call__(self, rows: int) -> float:
        return self.fixed_s + self.per_item_s * rows


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival: float
    rows: int = 1
    priority: int = 0
    timeout_us: int = 0
    shape_key: Hashable = "a"


def poisson_arrivals(rate_per_s: float, count: int, seed: int, start: float = 0.0) -> list[float]:
    """``count`` arrival times of a Poisson process of ``rate_per_s``, seeded."""
    rng = random.Random(seed)
    t, out = start, []
    for _ in range(count):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


@dataclass(frozen=True, slots=True)
class SimResult:
    latencies: tuple[float, ...]  # queue + execution seconds of each completed request, by request index
    completed: tuple[int, ...]  # indices of the completed requests, in completion order
    completion_times: tuple[float, ...]  # matching ``completed``
    queue_waits: Mapping[int, float]  # request index -> seconds from arrival to dispatch
    rejected: tuple[int, ...]  # indices refused at add (queue full, bad priority) or timed out (REJECT)
    batch_sizes: tuple[int, ...]
    reasons: Counter[str]  # BatchReason values of the batches
    first_arrival: float
    last_arrival: float
    last_completion: float
    busy_s: float  # execution seconds summed over instances
    instances: int
    stats: BatcherStats

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile (``q`` in [0, 100]) of the latencies; nan when none completed."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def mean(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else math.nan

    @property
    def throughput(self) -> float:
        """Completed requests per second, from the first arrival to the last completion."""
        span = self.last_completion - self.first_arrival
        return len(self.latencies) / span if span > 0 else math.nan

    @property
    def steady_throughput(self) -> float:
        """Completions per second while requests keep arriving: from the 10th-percentile completion
        time to the last arrival. It leaves out the warm-up and the drain after the stream ends (where
        an adaptive batcher still waits for requests that no longer come), which a finite run adds.
        """
        if not self.completion_times:
            return math.nan
        ordered = sorted(self.completion_times)
        start, end = ordered[len(ordered) // 10], self.last_arrival
        done = sum(1 for t in ordered if start < t <= end)
        return done / (end - start) if end > start else math.nan

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else math.nan

    @property
    def utilization(self) -> float:
        """Busy share of the instances over the run."""
        span = self.last_completion - self.first_arrival
        return self.busy_s / (span * self.instances) if span > 0 else math.nan


def simulate(
    policy: BatchPolicy,
    requests: Sequence[float] | Sequence[SimRequest],
    exec_time: Callable[[int], float],
    instances: int = 1,
    hidden_s: Callable[[int], float] | None = None,
    feedback: bool = True,
) -> SimResult:
    """Run ``requests`` (arrival times, or :class:`SimRequest`) through a batcher on ``instances``.

    ``hidden_s(rows)``: extra seconds of a batch that the batcher does not hear of (module docstring).
    ``feedback=False`` keeps the observed latencies from the batcher (the adaptive mode without its loop).
    """
    reqs = [r if isinstance(r, SimRequest) else SimRequest(r) for r in requests]
    if any(b.arrival < a.arrival for a, b in zip(reqs, reqs[1:], strict=False)):
        raise ValueError("requests must be in arrival order")
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    running: list[tuple[float, float, Batch] | None] = [None] * instances  # (end, exec_s heard, batch)
    latency: dict[int, float] = {}
    completed: list[int] = []
    done_at: list[float] = []
    waits: dict[int, float] = {}
    rejected: list[int] = []
    sizes: list[int] = []
    reasons: Counter[str] = Counter()
    busy = 0.0
    now, nxt, last = 0.0, 0, 0.0
    while True:
        while nxt < len(reqs) and reqs[nxt].arrival <= now:
            r = reqs[nxt]
            try:
                queued = QueuedRequest(nxt, r.rows, r.shape_key, r.arrival, r.priority, r.timeout_us)
                batcher.add(queued, now, any(run is not None for run in running))
            except (QueueFull, InvalidPriority):
                rejected.append(nxt)
            nxt += 1
        for i, run in enumerate(running):
            if run is not None and run[0] <= now:
                end, exec_s, batch = run
                for item in batch.items:
                    latency[item] = end - reqs[item].arrival
                    completed.append(item)
                    done_at.append(end)
                batcher.observe_execution(batch.size, exec_s, end)
                if feedback:
                    batcher.observe_latencies((end - reqs[item].arrival for item in batch.items), end)
                running[i], last = None, max(last, end)
        rejected.extend(batcher.expire(now))
        free = [i for i, run in enumerate(running) if run is None]
        for i, batch in zip(free, batcher.pop_ready(now, len(free)), strict=False):
            exec_s = exec_time(batch.size)
            took = exec_s + (hidden_s(batch.size) if hidden_s is not None else 0.0)
            running[i] = (now + took, exec_s, batch)
            sizes.append(batch.size)
            waits.update((item, now - reqs[item].arrival) for item in batch.items)
            reasons[batch.reason.value] += 1
            busy += took
        wake = [run[0] for run in running if run is not None]
        if nxt < len(reqs):
            wake.append(reqs[nxt].arrival)
        timer = batcher.next_deadline() if any(run is None for run in running) else batcher.next_expiry()
        if timer is not None:
            wake.append(timer)
        wake = [t for t in wake if t > now]
        if not wake:
            if len(batcher):
                raise RuntimeError(f"simulation stuck at t={now} with {len(batcher)} requests queued")
            break
        now = min(wake)
    return SimResult(
        latencies=tuple(latency[i] for i in sorted(latency)),
        completed=tuple(completed),
        completion_times=tuple(done_at),
        queue_waits=waits,
        rejected=tuple(rejected),
        batch_sizes=tuple(sizes),
        reasons=reasons,
        first_arrival=reqs[0].arrival if reqs else 0.0,
        last_arrival=reqs[-1].arrival if reqs else 0.0,
        last_completion=last,
        busy_s=busy,
        instances=instances,
        stats=batcher.stats(),
    )
