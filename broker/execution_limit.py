"""The per-model execution limit, and which instances are busy and since when.

A model may bound how long one batch runs on an instance with the ``parameters`` key
``execution_timeout_ms`` (a positive whole number of milliseconds, as a string like every parameter)::

    parameters { key: "execution_timeout_ms" value: { string_value: "5000" } }

The clock of a batch starts when the broker sends it to the instance. A batch still running past the
limit fails, every request with ``DeadlineExceeded``, and its worker is killed and restarted (a model stuck
in a loop keeps heartbeating, so nothing else would notice). For a decoupled (streaming) model the limit
bounds the whole stream of a batch, from the start to its final response, not the gap between responses.

Pure: the clock (monotonic nanoseconds) is passed in; ``WorkerWatch`` acts on the answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from zinfer.client.errors import ConfigError

from .model_config import ModelConfig

if TYPE_CHECKING:
    from .model_state import InFlight

__all__ = ["EXECUTION_TIMEOUT_PARAMETER", "busy_since", "execution_limit_ns", "overdue"]

EXECUTION_TIMEOUT_PARAMETER = "execution_timeout_ms"
_MAX_DIGITS = 12  # up to about 31 years: enough, and never a huge number to parse


def execution_limit_ns(config: ModelConfig) -> int | None:
    """The model's execution limit in nanoseconds, None without one; a bad value is a ConfigError."""
    raw = config.parameters.get(EXECUTION_TIMEOUT_PARAMETER)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS) or int(text) == 0:
        raise ConfigError(
            f"model '{config.name}': parameter {EXECUTION_TIMEOUT_PARAMETER} must be a positive whole "
            f"number of milliseconds, got {raw!r}"
        )
    return int(text) * 1_000_000


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
