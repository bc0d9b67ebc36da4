"""The per-model execution limit, and which instances are busy and since when.

A model may bound how long one batch runs on an instance with the ``parameters`` key
``execution_timeout_ms`` (a positive whole number of milliseconds, as a string like every parameter)::

    parameters { key: "execution_timeout_ms" value: { string_value: "5000" } }

The clock of a batch starts when the broker sends it to the instance. A batch still running past the
limit fails, every request with ``DeadlineExceeded``, and its worker is killed and restarted (a model stuck
in a loop keeps heartbeating, so nothing else would notice). For a decoupled (streaming) model the limit
bounds the whole stream of a batch, from the start to its final response, not the gap between responses.
The parameter is read and checked by ``zinfer.modelconfig.parameters.execution_limit_ns``.

Pure: the clock (monotonic nanoseconds) is passed in; ``WorkerWatch`` acts on the answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model_state import InFlight

__all__ = ["busy_since", "overdue"]


def _running(batches: Iterable[InFlight]) -> dict[bytes, InFlight]:
    """The batch each busy worker is running: its oldest (a prefetching worker may hold a second)."""
    oldest: dict[bytes, InFlight] = {}
    for batch in batches:
        seen = oldest.get(batch.worker)
        if seen is None or batch.sent_ns < seen.sent_ns:
            oldest[batch.worker] = batch
    return oldest


def busy_since(batches: Iterable[InFlight]) -> dict[bytes, int]:
    """When each busy worker's current batch was sent to it (monotonic ns); idle workers are absent."""
    return {worker: batch.sent_ns for worker, batch in _running(batches).items()}


def overdue(batches: Iterable[InFlight], now_ns: int) -> list[InFlight]:
    """The batches that have run longer than their model's execution limit, one per worker at most."""
    late = []
    for batch in _running(batches).values():
        limit = batch.model.execution_limit_ns
        if limit is not None and now_ns - batch.sent_ns > limit:
            late.append(batch)
    return late
