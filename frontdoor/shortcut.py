"""A benchmark's door that answers without the broker: the cost of the door's own parts, measured apart.

With ``ZINFER_FRONTDOOR_SHORTCUT=1`` in a front-door process's environment (``bench/profile_frontdoor.py``
sets it; nothing else does), the bridge sends a model's first inference to the broker and records the
reply; after that it answers every inference of that model from the record, so what remains is the server
library, the protocol conversion and the door's encoding of the reply. One inference in ``FORWARD_EVERY``
still goes to the broker, in the background, so that the server's statistics keep moving (perf_analyzer
refuses a model whose counts stand still). Never for serving: the answers are not the model's.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

__all__ = ["ENV", "FORWARD_EVERY", "Shortcut", "from_environment"]

ENV = "ZINFER_FRONTDOOR_SHORTCUT"
FORWARD_EVERY = 50

R = TypeVar("R")


class Shortcut(Generic[R]):
    """Recorded replies by model; ``answer`` says whether this call is answered from the record."""

    def __init__(self) -> None:
        self._recorded: dict[str, R] = {}
        self._count = 0

    def recorded(self, model: str) -> R | None:
        return self._recorded.get(model)

    def forward_now(self) -> bool:
        """Whether this answered call should also go to the broker (in the background)."""
        self._count += 1
        return self._count % FORWARD_EVERY == 0

    def record(self, model: str, reply: R) -> None:
        if len(self._recorded) < 64:
            self._recorded[model] = reply


def from_environment() -> bool:
    return os.environ.get(ENV, "") == "1"
