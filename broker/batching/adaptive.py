"""Adaptive batching toward a latency target (``zinfer_latency_target_microseconds``). Pure, clock-injected.

With a target ``T`` the batcher ignores ``max_queue_delay`` and asks :meth:`AdaptiveController.plan`, for
the batch it would send now, until when waiting for more requests still pays. It learns execution time per
batch size and the arrival rate online, sends at once when a bigger batch gains nothing (light load, or a
target too tight), and :class:`LatencyFeedback` turns every request's observed latency into a slack the
rule plans with. The decision rule and its reasoning are in docs/adaptive-batching.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["AdaptiveController", "AdaptiveStats", "ArrivalEstimator", "ExecEstimator", "LatencyFeedback"]

HEADROOM = 0.9  # plan for 90% of the target: estimates are noisy and arrivals are random
MIN_SAMPLES = 3  # samples before a size's own EWMA replaces the fitted line
EXEC_ALPHA = 0.2  # EWMA weight of a new execution-time sample
GAP_ALPHA = 1 / 16  # EWMA weight of a new inter-arrival gap
_FIT_WEIGHT_CAP = 16  # a size's weight in the fit grows with its samples up to this
_MIN_GAP_S = 1e-7  # floor of the mean gap (caps the rate estimate at 10 M rows/s)
FEEDBACK_WINDOW = 512  # observed latencies the slack is learned over
FEEDBACK_EVERY = 32  # observations between two updates of the slack
FEEDBACK_MAX_AGE_S = 10.0  # older observations leave the window (the load may have changed)
FEEDBACK_QUANTILE = 0.99


class ExecEstimator:
    """Online estimate of execution seconds per batch size."""

    def __init__(self, alpha: float = EXEC_ALPHA) -> None:
        self._alpha = alpha
        self._ewma: dict[int, float] = {}
        self._samples: dict[int, int] = {}
        self._fit: tuple[float, float] | None = None

    def observe(self, size: int, seconds: float) -> None:
        if size < 1 or not seconds >= 0 or math.isinf(seconds):
            raise ValueError(f"need batch size >= 1 and finite seconds >= 0, got {size}, {seconds!r}")
        old = self._ewma.get(size)
        self._ewma[size] = seconds if old is None else old + self._alpha * (seconds - old)
        self._samples[size] = self._samples.get(size, 0) + 1
        self._fit = self._refit()

    @property
    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_item)`` seconds, or None before the first sample."""
        return self._fit

    def estimate(self, size: int) -> float | None:
        """Estimated seconds for a batch of ``size`` rows, or None before the first sample."""
        if self._samples.get(size, 0) >= MIN_SAMPLES:
            return self._ewma[size]
        if self._fit is None:
            return None
        fixed, per_item = self._fit
        return fixed + per_item * size

    def table(self) -> tuple[tuple[int, float, int], ...]:
        """``(size, EWMA seconds, samples)`` for every size seen."""
        return tuple((s, self._ewma[s], self._samples[s]) for s in sorted(self._ewma))

    def _refit(self) -> tuple[float, float]:
        points = [(s, e, min(self._samples[s], _FIT_WEIGHT_CAP)) for s, e in self._ewma.items()]
        total = sum(w for _, _, w in points)
        mx = sum(w * s for s, _, w in points) / total
        my = sum(w * e for _, e, w in points) / total
        sxx = sum(w * (s - mx) ** 2 for s, _, w in points)
        if sxx <= 0:  # one size: all of it per item, so batching looks like no gain
            return 0.0, my / mx
        per_item = sum(w * (s - mx) * (e - my) for s, e, w in points) / sxx
        if per_item < 0:
            return my, 0.0
        fixed = my - per_item * mx
        if fixed < 0:  # through the origin instead
            return 0.0, sum(w * s * e for s, e, w in points) / sum(w * s * s for s, _, w in points)
        return fixed, per_item


class ArrivalEstimator:
    """Online estimate of the arrival rate in rows per second."""

    def __init__(self, alpha: float = GAP_ALPHA) -> None:
        self._alpha = alpha
        self._last: float | None = None
        self._gap: float | None = None
        self._rows: float | None = None

    def observe(self, arrival: float, rows: int) -> None:
        self._rows = rows if self._rows is None else self._rows + self._alpha * (rows - self._rows)
        if self._last is not None:
            gap = max(0.0, arrival - self._last)
            self._gap = gap if self._gap is None else self._gap + self._alpha * (gap - self._gap)
        self._last = arrival if self._last is None else max(self._last, arrival)

    def rate(self) -> float:
        """Rows per second; 0 before two arrivals."""
        if self._gap is None or self._rows is None:
            return 0.0
        return self._rows / max(self._gap, _MIN_GAP_S)


def _quantile(values: Iterable[float], q: float) -> float:
    """Nearest-rank quantile (``q`` in (0, 1]) of a non-empty collection."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class LatencyFeedback:
    """Learns the slack to keep back from the planning budget out of observed latencies (module docstring)."""

    def __init__(
        self,
        budget_s: float,
        window: int = FEEDBACK_WINDOW,
        every: int = FEEDBACK_EVERY,
        max_age_s: float = FEEDBACK_MAX_AGE_S,
    ) -> None:
        if not budget_s > 0 or window < 1 or every < 1 or not max_age_s > 0:
            raise ValueError(f"bad feedback settings: {budget_s=} {window=} {every=} {max_age_s=}")
        self._budget = budget_s
        self._every = every
        self._max_age = max_age_s
        self._window: deque[tuple[float, float, float]] = deque(maxlen=window)  # (now, latency, slack)
        self._since_update = 0
        self.slack_s = 0.0
        self.p99_s: float | None = None  # observed p99 over the window at the last update

    @property
    def saturated(self) -> bool:
        """The slack has eaten the whole budget: the plan no longer waits at all."""
        return self.slack_s >= self._budget

    def observe(self, latency_s: float, now: float) -> bool:
        """One request's observed latency; True when the slack changed."""
        if not latency_s >= 0 or math.isinf(latency_s):
            raise ValueError(f"need finite latency seconds >= 0, got {latency_s!r}")
        self._window.append((now, latency_s, self.slack_s))
        self._since_update += 1
        if self._since_update < self._every:
            return False
        self._since_update = 0
        while self._window and self._window[0][0] < now - self._max_age:
            self._window.popleft()
        if len(self._window) < self._every:  # too few recent samples for a p99
            return False
        self.p99_s = _quantile((o for _, o, _ in self._window), FEEDBACK_QUANTILE)
        need = _quantile((o + s for _, o, s in self._window), FEEDBACK_QUANTILE) - self._budget
        old, self.slack_s = self.slack_s, min(self._budget, max(0.0, need))
        return self.slack_s != old


@dataclass(frozen=True, slots=True)
class AdaptiveStats:
    """A snapshot of the adaptive controller, for metrics and logs."""

    target_s: float
    arrival_rate: float  # rows per second
    exec_fixed_s: float | None  # the fitted line; None before the first execution
    exec_per_item_s: float | None
    exec_estimates: tuple[tuple[int, float, int], ...]  # (size, EWMA seconds, samples)
    target_misses: int  # requests that could not meet the target even sent alone at once
    dispatched: int  # requests sent in adaptive mode
    planned_wait_s: float  # at the last decision: how long the batcher chose to wait (0 = sent)
    slack_s: float  # learned from observed latencies: planning budget kept back (module docstring)
    observed: int  # observed latencies fed back
    observed_misses: int  # of those, over the target
    observed_p99_s: float | None  # p99 of the recent observed latencies; None before enough came
    target_unreachable: bool  # the batcher already sends at once and the observed p99 is over the target


def _candidates(n: int, cap: int) -> Iterator[int]:
    """Sizes above ``n`` up to ``cap``: every size near ``n``, then a geometric ladder, then ``cap``."""
    step = 1
    while n + step < cap:
        yield n + step
        step = max(step + 1, int(step * 1.25))
    if cap > n:
        yield cap


class AdaptiveController:
    """Decides how long a batch may wait for more requests within a latency target (module docstring)."""

    def __init__(self, target_s: float, cap: int, instances: int = 1, headroom: float = HEADROOM) -> None:
        if not target_s > 0 or cap < 1 or instances < 1 or not 0 < headroom <= 1:
            raise ValueError(f"bad adaptive settings: {target_s=} {cap=} {instances=} {headroom=}")
        self.target_s = target_s
        self._cap = cap
        self._instances = instances
        self._budget = headroom * target_s
        self.exec = ExecEstimator()
        self.arrivals = ArrivalEstimator()
        self.feedback = LatencyFeedback(self._budget)
        self._observed = self._observed_misses = 0
        self._misses = 0
        self._dispatched = 0
        self._planned_wait = 0.0

    def plan(self, n: int, oldest: float) -> float | None:
        """When a batch of ``n`` rows, oldest queued at ``oldest``, should go; None = now, at any time."""
        lam = self.arrivals.rate()
        e_n = self.exec.estimate(n)
        budget = self._budget - self.feedback.slack_s
        if n >= self._cap or lam <= 0 or not e_n or budget <= 0:
            return None
        rho = min(1.0, lam * e_n / (n * self._instances))
        flip: float | None = None
        for m in _candidates(n, self._cap):
            e_m = self._estimate(m)
            dt = (m - n) / lam
            follow = min(self._cap, max(1, math.ceil(lam * e_m)))
            if dt + e_m > budget or e_m + self._estimate(follow) > budget:
                break  # larger sizes only wait and run longer
            gain = rho * (m * e_n / (n * e_m) - 1) if e_m > 0 else 0.0
            if gain > (dt + e_m - e_n) / self.target_s:
                last = oldest + budget - dt - e_m
                flip = last if flip is None else max(flip, last)
        return flip

    def note_decision(self, now: float, flip: float | None) -> None:
        """Record the wait chosen at ``now`` (for :meth:`stats`)."""
        self._planned_wait = max(0.0, flip - now) if flip is not None else 0.0

    def observe_latency(self, latency_s: float, now: float) -> bool:
        """One request's observed latency (enqueue to result); True when the plan may have changed."""
        self._observed += 1
        if latency_s > self.target_s:
            self._observed_misses += 1
        return self.feedback.observe(latency_s, now)

    def record_dispatch(self, now: float, arrivals: Iterable[float]) -> None:
        """Count the requests of a batch sent at ``now`` that could not meet the target in any case."""
        alone = self._estimate(1)
        for arrival in arrivals:
            self._dispatched += 1
            if now - arrival + alone > self.target_s:
                self._misses += 1

    def stats(self) -> AdaptiveStats:
        fit = self.exec.fit
        return AdaptiveStats(
            target_s=self.target_s,
            arrival_rate=self.arrivals.rate(),
            exec_fixed_s=fit[0] if fit else None,
            exec_per_item_s=fit[1] if fit else None,
            exec_estimates=self.exec.table(),
            target_misses=self._misses,
            dispatched=self._dispatched,
            planned_wait_s=self._planned_wait,
            slack_s=self.feedback.slack_s,
            observed=self._observed,
            observed_misses=self._observed_misses,
            observed_p99_s=self.feedback.p99_s,
            target_unreachable=self._unreachable(),
        )

    def _unreachable(self) -> bool:
        p99 = self.feedback.p99_s
        return self.feedback.saturated and p99 is not None and p99 > self.target_s

    def _estimate(self, size: int) -> float:
        return self.exec.estimate(size) or 0.0
