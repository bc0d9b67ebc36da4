"""``preserve_ordering``: release a model's responses in request arrival order. Pure, no I/O.

Keep one :class:`ResponseOrder` per model. :meth:`~ResponseOrder.submit` each request's sequence number
as it arrives; :meth:`~ResponseOrder.complete` it with its response when that is ready, in any order, and
send what it returns; :meth:`~ResponseOrder.drop` a request that gets no ordered response (cancelled, or
failed before it executed) so it does not hold back the ones behind it. A response is released once
every request submitted before it has completed or been dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar, cast

__all__ = ["ResponseOrder"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_DROPPED = object()


class ResponseOrder(Generic[K, V]):
    """Responses held until every earlier request of the model has one (or was dropped)."""

    def __init__(self) -> None:
        self._order: deque[K] = deque()  # submitted and not yet released, arrival order
        self._done: dict[K, object] = {}  # completed (value) or dropped (_DROPPED), not yet released
        self._waiting: set[K] = set()  # submitted, not completed nor dropped

    def __len__(self) -> int:
        """Requests submitted and not yet released."""
        return len(self._order)

    @property
    def held(self) -> int:
        """Completed responses held back behind an earlier request."""
        return sum(1 for v in self._done.values() if v is not _DROPPED)

    def submit(self, seq: K) -> None:
        """Register a request, in arrival order."""
        if seq in self._waiting or seq in self._done:
            raise ValueError(f"request {seq!r} was already submitted")
        self._order.append(seq)
        self._waiting.add(seq)

    def complete(self, seq: K, value: V) -> list[tuple[K, V]]:
        """Record ``seq``'s response; return the responses now ready to send, in arrival order."""
        self._finish(seq)
        self._done[seq] = value
        return self._release()

    def drop(self, seq: K) -> list[tuple[K, V]]:
        """Forget ``seq`` (it sends no ordered response); return the responses it was holding back."""
        self._finish(seq)
        self._done[seq] = _DROPPED
        return self._release()

    def _finish(self, seq: K) -> None:
        try:
            self._waiting.remove(seq)
        except KeyError:
            state = "already completed or dropped" if seq in self._done else "not submitted"
            raise KeyError(f"request {seq!r} is {state}") from None

    def _release(self) -> list[tuple[K, V]]:
        ready: list[tuple[K, V]] = []
        while self._order and self._order[0] in self._done:
            seq = self._order.popleft()
            value = self._done.pop(seq)
            if value is not _DROPPED:
                ready.append((seq, cast(V, value)))  # only a V or _DROPPED is stored
        return ready
