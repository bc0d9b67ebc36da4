"""Memory budgets of on-demand model control: ``--memory-budget host=2G`` and ``--memory-budget gpu0=20G``.

A budget names a memory (``host``, or ``gpuN`` for GPU index N) and the bytes the resident models may hold
there. Sizes take a decimal number with an optional binary suffix (``K``, ``M``, ``G``, ``T``, with or
without ``i`` and ``B``: ``512M``, ``1.5GiB``); a bare number is bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["HOST", "MemoryBudget", "device_memory", "parse_budget", "parse_bytes"]

HOST = "host"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_MEMORY = re.compile(r"^(host|gpu(\d{1,3}))$")


def parse_bytes(text: str) -> int:
    """``"512M"`` -> 536870912; raises ValueError naming what is wrong."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (a number of bytes, optionally with K, M, G or T)")
    number = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if number < 1:
        raise ValueError(f"a budget must be at least 1 byte, got {text!r}")
    return int(number)


def device_memory(device: str) -> str:
    """The memory an instance placed on ``device`` (``cpu``, ``gpu:N``) uses besides the host's."""
    return f"gpu{device.split(':', 1)[1]}" if device.startswith("gpu:") else HOST


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes the resident models may hold, per memory; a memory not named has no limit."""

    limits: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.limits)

    def describe(self, memory: str) -> str:
        """The budget as errors and logs name it: ``host budget of 512.0 MiB (--memory-budget host=N)``."""
        limit = self.limits[memory]
        return f"{memory} budget of {format_bytes(limit)} (--memory-budget {memory}={limit})"


def parse_budget(items: Iterable[str]) -> MemoryBudget:
    """``["host=2G", "gpu0=20G"]`` as a budget; raises ValueError naming the bad item."""
    limits: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        name = name.strip().lower()
        if not sep or _MEMORY.fullmatch(name) is None:
            raise ValueError(f"{item!r}: expected host=BYTES or gpuN=BYTES (e.g. host=8G, gpu0=20G)")
        if name in limits:
            raise ValueError(f"{item!r}: the {name} budget is given twice")
        try:
            limits[name] = parse_bytes(size)
        except ValueError as exc:
            raise ValueError(f"{item!r}: {exc}") from None
    return MemoryBudget(limits)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
