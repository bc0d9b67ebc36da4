"""Runs: several requests of a model that executes each request on its own, sent to one instance at once.

A model without ``dynamic_batching`` (Triton's default scheduler) executes every request alone. When its
queue is longer than its free places, each place may take a *run*: up to :func:`run_length` of the queued
requests in one EXECUTE, which the worker executes one after the other, each alone, and answers in one
RESULT. Every request is still its own execution with its own statistics; what changes is the number of
messages, one each way per run instead of per request, and that the answers of a run leave together.
The runs go to the instances running nothing first (:func:`run_targets`).

How long a run may be follows from what one execution costs on the instance (:class:`ExecutionCost`, from
the worker's own timings): a run takes at most :data:`RUN_BUDGET_NS` of computing, so no answer is held
back longer than that, and at most :data:`RUN_MAX` requests. A run is never longer than the queue split
evenly over the free places, so every free instance gets its share. Until one execution was timed, and
whenever the queue is no longer than the free places, each request goes alone as before.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
W = TypeVar("W", bound=Hashable)

RUN_MAX = 16
RUN_BUDGET_NS = 1_000_000  # the computing one run may hold its first answer back for
COST_WEIGHT = 0.2  # weight of the newest execution in the running average


@dataclass
class ExecutionCost:
    """The running average of one execution's time on the model's instances (input, model and output,
    as the worker times them); 0 until the first result."""

    ns: float = 0.0

    def observe(self, total_ns: int, executions: int) -> None:
        if executions <= 0 or total_ns < 0:
            return
        x = total_ns / executions
        self.ns = x if self.ns == 0.0 else self.ns + COST_WEIGHT * (x - self.ns)


def run_length(queued: int, places: int, cost_ns: float) -> int:
    """Requests each of ``places`` free places takes from a queue of ``queued``, given one execution's
    cost (``ExecutionCost.ns``): at least 1, at most the budget, :data:`RUN_MAX` and the even share."""
    if places <= 0 or queued <= places or cost_ns <= 0.0:
        return 1
    cap = max(1, min(RUN_MAX, int(RUN_BUDGET_NS // cost_ns)))
    share = -(-queued // places)
    return min(cap, share)


def run_targets(places: Iterable[W]) -> list[W]:
    """The instances a backlog's runs go to, in line, from the free places (an instance that runs nothing
    has two, its own and the one its next request waits in): those running nothing, as a batcher gives a
    batch to a free instance; only when none is, every instance with a free place."""
    free: dict[W, int] = {}  # counted here, not by a Counter: its constructor runs as interpreted code
    for w in places:
        free[w] = free.get(w, 0) + 1
    return [w for w, n in free.items() if n > 1] or list(free)


def split_runs(items: Sequence[T], length: int) -> list[list[T]]:
    """``items`` in runs of ``length`` (the last may be shorter), in order."""
    step = max(1, length)
    return [list(items[i : i + step]) for i in range(0, len(items), step)]
