"""Early dispatch: ``max_queue_delay_microseconds`` as an upper bound, as Triton defines it. Pure, no clock.

Triton's dynamic batcher holds a batch that reached no preferred size until its oldest request has waited the
whole delay. When no other request can come in that time (one client calling in a loop: its next request
leaves only after this one's reply), the wait buys nothing and is added to every request's latency.

:class:`EarlyDispatch` learns, from the arrivals of one model, the rate of *companions*: requests that come
while another request of the model is queued or running, so that they could share its batch. It keeps

* the arrival rate ``lam`` in rows per second (``adaptive.ArrivalEstimator``: EWMAs of the gap between
  arrivals and of the rows per request), and
* ``overlap``, an EWMA of whether an arrival found another request of the model queued or in flight
  (starting at 1: until it has seen otherwise it assumes companions come, as Triton does).

``lam * overlap`` is the companion rate. A batch whose oldest request arrived at ``t0`` goes at ``t0`` (at
once) when fewer than :data:`COMPANION_ROWS` companion rows are expected within the whole delay,
``lam * overlap * delay < COMPANION_ROWS``, and at ``t0 + delay`` (Triton's time) otherwise. So:

* never later than the delay: :meth:`EarlyDispatch.send_at` is ``t0`` or ``t0 + delay``;
* under load nothing changes: when arrivals at the observed rate bring a companion within the delay (a
  preferred size reachable within it needs at least that), the batch waits as in Triton; a preferred size,
  the size limit or a shape cut sends at once as before (the batcher decides those first);
* one client in a loop: its arrivals never find another request of the model, ``overlap`` falls toward 0
  and its requests go at once; before two arrivals have been seen there is no rate and the timing is
  Triton's.

The batcher reports a batch sent this way with ``BatchReason.EARLY_NO_COMPANION`` (statistics
``batch_reasons``, metric ``zinfer_batch_reason_total{reason="early_no_companion"}``). A model turns it
off with ``parameters { key: "zinfer_early_dispatch" value: { string_value: "false" } }`` for Triton-identical
timing (``modelconfig.parameters.early_dispatch``).
"""

from __future__ import annotations

from .adaptive import GAP_ALPHA, ArrivalEstimator

__all__ = ["COMPANION_ROWS", "OVERLAP_ALPHA", "EarlyDispatch"]

COMPANION_ROWS = 0.5  # fewer companion rows than this expected within the delay: waiting does not pay
OVERLAP_ALPHA = 1 / 8  # EWMA weight of one arrival in ``overlap``


class EarlyDispatch:
    """When a batch that reached no preferred size should go (module docstring). Not thread-safe."""

    def __init__(self, delay_s: float, alpha: float = OVERLAP_ALPHA) -> None:
        if not delay_s >= 0 or not 0 < alpha <= 1:
            raise ValueError(f"need delay_s >= 0 and alpha in (0, 1], got {delay_s!r}, {alpha!r}")
        self._delay = delay_s
        self._alpha = alpha
        self._arrivals = ArrivalEstimator(GAP_ALPHA)
        self._overlap = 1.0
        self._early = False  # the decision, recomputed at each arrival (the only thing that changes it)

    def observe(self, arrival: float, rows: int, overlapping: bool) -> None:
        """An arrival of ``rows`` rows at ``arrival``; ``overlapping``: another request of the model was
        queued or in flight when it came."""
        self._arrivals.observe(arrival, rows)
        self._overlap += self._alpha * ((1.0 if overlapping else 0.0) - self._overlap)
        rate = self._arrivals.rate()
        self._early = rate > 0 and rate * self._overlap * self._delay < COMPANION_ROWS

    @property
    def early(self) -> bool:
        """Whether a batch goes at once: fewer than ``COMPANION_ROWS`` companion rows are due in the delay."""
        return self._early

    def companion_rate(self) -> float:
        """Companion rows per second (0 before two arrivals)."""
        return self._arrivals.rate() * self._overlap

    def send_at(self, oldest: float) -> float:
        """When a batch whose oldest request arrived at ``oldest`` goes, if nothing sends it sooner."""
        return oldest if self._early else oldest + self._delay
