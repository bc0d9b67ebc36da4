"""A sliding window of one model's recent latencies and batch sizes, for ``zinfer status``.

Pure: the clock is passed in (``now`` in seconds, e.g. ``time.monotonic()``), so tests drive it with a
fake clock. The window is a ring of one-second buckets; a bucket is reset when its second comes round
again, so memory is bounded by ``seconds`` buckets whatever the request rate. Latencies are kept as
counts in log-spaced bins (each ``resolution`` times wider than the last, from 1 us), so a quantile is
exact to within one bin (5% by default) and reported as the bin's upper edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LatencyWindow", "WindowStats", "log_bin"]

_MAX_BIN = 1000  # latencies beyond resolution**1000 us all land in the last bin


@dataclass(frozen=True, slots=True)
class WindowStats:
    """The window's figures at one moment; ``None`` where nothing was recorded."""

    rate: float  # requests per second
    p99_s: float | None
    mean_batch: float | None


def log_bin(us: float, inv_log_r: float) -> int:
    """The bin of a latency of ``us`` microseconds: bin ``b`` holds (r**(b-1), r**b] us, bin 0 up to 1 us."""
    return min(_MAX_BIN, math.ceil(math.log(us) * inv_log_r)) if us > 1.0 else 0


class LatencyWindow:
    """``record`` each answered request, ``batch`` each batch sent; query with ``p99``/``rate``/…"""

    __slots__ = (
        "seconds", "_inv_log_r", "_r", "_secs", "_counts", "_bins", "_batches", "_rows", "_start",
        "_sec", "_i",
    )  # fmt: skip

    def __init__(self, seconds: int = 60, resolution: float = 1.05, start: float | None = None) -> None:
        if seconds < 1 or resolution <= 1.0:
            raise ValueError("seconds must be >= 1 and resolution > 1")
        self.seconds = seconds
        self._r = resolution
        self._inv_log_r = 1.0 / math.log(resolution)
        self._secs = [-1] * seconds  # which second each slot holds
        self._counts = [0] * seconds
        self._bins: list[dict[int, int]] = [{} for _ in range(seconds)]
        self._batches = [0] * seconds
        self._rows = [0] * seconds
        self._start = start  # when the window began counting (the first record if not given)
        self._sec, self._i = -1, 0  # the second last written, and its slot

    def _slot(self, now: float) -> int:
        """The ring slot for ``now``, reset if it held an older second; -1 if ``now`` is too old."""
        sec = math.floor(now)
        if sec == self._sec:
            return self._i
        i = sec % self.seconds
        held = self._secs[i]
        if held != sec:
            if held > sec:
                return -1
            self._secs[i] = sec
            self._counts[i] = self._batches[i] = self._rows[i] = 0
            self._bins[i] = {}
        if self._start is None:
            self._start = now
        if sec > self._sec:
            self._sec, self._i = sec, i
        return i

    def record(self, now: float, latency_s: float) -> None:
        """One request answered at ``now`` after ``latency_s`` seconds."""
        i = self._slot(now)
        if i < 0:
            return
        b = log_bin(latency_s * 1e6, self._inv_log_r)
        bins = self._bins[i]
        bins[b] = bins.get(b, 0) + 1
        self._counts[i] += 1

    def batch(self, now: float, size: int) -> None:
        """One batch of ``size`` rows sent at ``now``."""
        i = self._slot(now)
        if i >= 0:
            self._batches[i] += 1
            self._rows[i] += size

    def _live(self, now: float) -> list[int]:
        """The slots inside the window ending at ``now``: seconds ``now - seconds + 1`` … ``now``."""
        sec = math.floor(now)
        return [i for i, s in enumerate(self._secs) if sec - self.seconds < s <= sec]

    def count(self, now: float) -> int:
        return sum(self._counts[i] for i in self._live(now))

    def rate(self, now: float) -> float:
        """Requests per second over the window (or over the time since it began, when shorter, min 1 s)."""
        span = self.seconds - 1 + (now - math.floor(now))
        if self._start is not None:
            span = min(span, now - self._start)
        return self.count(now) / max(1.0, span)

    def quantile(self, now: float, q: float) -> float | None:
        """The ``q`` quantile of the latencies in the window, in seconds (nearest rank, bin upper edge)."""
        merged: dict[int, int] = {}
        for i in self._live(now):
            for b, n in self._bins[i].items():
                merged[b] = merged.get(b, 0) + n
        total = sum(merged.values())
        if total == 0:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for b in sorted(merged):
            seen += merged[b]
            if seen >= rank:
                return self._r**b / 1e6
        return None  # pragma: no cover - seen reaches total

    def p99(self, now: float) -> float | None:
        return self.quantile(now, 0.99)

    def mean_batch(self, now: float) -> float | None:
        """Mean rows per batch over the window."""
        live = self._live(now)
        batches = sum(self._batches[i] for i in live)
        return sum(self._rows[i] for i in live) / batches if batches else None

    def stats(self, now: float) -> WindowStats:
        return WindowStats(self.rate(now), self.p99(now), self.mean_batch(now))
