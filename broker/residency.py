"""Which models stay resident under a memory budget: the eviction policy of on-demand model control.

Pure: no processes, sockets or clocks; the caller passes what it measured and the time. A footprint maps a
memory (``host``, ``gpuN``) to bytes. ``plan_room`` answers, for a model about to load, which resident
models to unload first (least recently used first, never one in use or pinned) and whether the load may
start now, must wait for memory that is being freed, or cannot fit at all (and which budget it misses).
``over_budget`` and ``idle`` pick models to unload after a measurement or an idle time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .memory_budget import HOST, MemoryBudget, device_memory, format_bytes

__all__ = ["Footprint", "Resident", "RoomPlan", "estimate", "idle", "over_budget", "plan_room", "total"]

Footprint = Mapping[str, int]


@dataclass(frozen=True)
class Resident:
    """A loaded model as the policy sees it."""

    name: str
    footprint: Footprint
    last_used: float  # the clock's time of its last request (or of its load)
    in_use: bool = False  # queued or running requests, live sequences, a running ensemble, a waiting load
    pinned: bool = False  # parameters { key: "zinfer_pinned" value: { string_value: "true" } }


@dataclass(frozen=True)
class RoomPlan:
    """What to do before a load: unload ``victims``; then start it now, or ``wait`` for memory still being
    freed; ``fits`` False: it cannot fit even so, and ``short`` says which budget it misses."""

    victims: tuple[str, ...] = ()
    fits: bool = True
    wait: bool = False
    short: str = ""


def total(footprints: Iterable[Footprint]) -> dict[str, int]:
    out: dict[str, int] = {}
    for fp in footprints:
        for memory, n in fp.items():
            out[memory] = out.get(memory, 0) + n
    return out


def _over(budget: MemoryBudget, used: Footprint) -> dict[str, int]:
    """Bytes over each budget (only memories that are over)."""
    return {m: used.get(m, 0) - limit for m, limit in budget.limits.items() if used.get(m, 0) > limit}


def _lru(residents: Sequence[Resident], exclude: frozenset[str]) -> list[Resident]:
    """The models that may be unloaded, least recently used first."""
    free = [r for r in residents if not r.in_use and not r.pinned and r.name not in exclude]
    return sorted(free, key=lambda r: (r.last_used, r.name))


def _choose(
    budget: MemoryBudget, used: dict[str, int], candidates: list[Resident]
) -> tuple[list[str], dict[str, int]]:
    """Victims in LRU order until nothing is over; each must free bytes in a memory that is over."""
    victims: list[str] = []
    over = _over(budget, used)
    for r in candidates:
        if not over:
            break
        if not any(r.footprint.get(m, 0) > 0 for m in over):
            continue
        victims.append(r.name)
        for m, n in r.footprint.items():
            used[m] = used.get(m, 0) - n
        over = _over(budget, used)
    return victims, over


def plan_room(
    budget: MemoryBudget,
    residents: Sequence[Resident],
    need: Footprint,
    loading: Footprint | None = None,
    freeing: Footprint | None = None,
) -> RoomPlan:
    """Room for a load of footprint ``need``, beside ``residents`` and the loads already under way
    (``loading``); ``freeing`` is memory of unloaded models whose processes have not exited yet."""
    for m, limit in budget.limits.items():
        if need.get(m, 0) > limit:
            return RoomPlan(fits=False, short=(
                f"the model needs about {format_bytes(need[m])} of {m} memory, more than the "
                f"{budget.describe(m)}"))  # fmt: skip
    used = total([*(r.footprint for r in residents), loading or {}, need])
    victims, over = _choose(budget, used, _lru(residents, frozenset()))
    if over:
        m = next(iter(over))
        held = [r for r in residents if r.footprint.get(m, 0) > 0 and (r.in_use or r.pinned)]
        why = ", ".join(f"{r.name} ({'pinned' if r.pinned else 'in use'})" for r in held) or "none"
        return RoomPlan(fits=False, short=(
            f"loading it would exceed the {budget.describe(m)} by {format_bytes(over[m])} and no loaded "
            f"model can be unloaded (held: {why})"))  # fmt: skip
    victim_bytes = total(r.footprint for r in residents if r.name in victims)
    after = total([used, victim_bytes, freeing or {}])
    return RoomPlan(tuple(victims), True, bool(_over(budget, after)))


def over_budget(
    budget: MemoryBudget, residents: Sequence[Resident], loading: Footprint | None = None,
    keep: frozenset[str] = frozenset(),
) -> tuple[str, ...]:  # fmt: skip
    """Models to unload because the measured total (with ``loading``) is over a budget, LRU first; those
    in ``keep`` (just loaded) stay."""
    used = total([*(r.footprint for r in residents), loading or {}])
    victims, _ = _choose(budget, used, _lru(residents, keep))
    return tuple(victims)


def idle(residents: Sequence[Resident], now: float, idle_s: float) -> tuple[str, ...]:
    """Models unused for ``idle_s`` seconds that may be unloaded, LRU first."""
    return tuple(r.name for r in _lru(residents, frozenset()) if now - r.last_used >= idle_s)


def estimate(
    devices: Sequence[str], measured: Footprint | None, per_instance: Mapping[str, int]
) -> dict[str, int]:
    """The footprint to plan with for a model placed on ``devices``: what it measured when last loaded,
    else ``per_instance`` (the mean instance of the models measured so far; ``host`` for any instance, and
    ``gpu`` for one on a GPU) times its instances; 0 when nothing was measured yet."""
    if measured:
        return dict(measured)
    out: dict[str, int] = {}
    for device in devices:
        out[HOST] = out.get(HOST, 0) + per_instance.get(HOST, 0)
        memory = device_memory(device)
        if memory != HOST:
            out[memory] = out.get(memory, 0) + per_instance.get("gpu", 0)
    return {m: n for m, n in out.items() if n}
