"""The rate limiter (Triton's ``instance_group.rate_limiter``): an instance runs a batch only when the
resources its group asks for are free.

A group lists ``resources [ { name, global, count } ]`` and a ``priority``. Each resource is a pool of
``count`` copies per device (``cpu``, ``gpu:N``) or, for a ``global`` one, a single pool for the whole
server. A batch takes its instance's resources when it is sent and gives them back when its result comes
or its instance dies. Pool sizes come from the server (``rate_limit_resources``: name, count and a device,
or no device for every device and the global pool); a resource the server does not size gets the largest
count any one instance asks for (Triton's rule), so every instance can run alone.

Models waiting for the same resources take turns by stride scheduling: the one with the lowest pass goes
next and its pass grows by its priority, so priority 2 gets half the turns of priority 1 (0 counts as 1).
A model returning after an idle spell starts at the current pass, so it cannot claim the turns it missed.

Pure: no clock, no sockets; the broker passes instance and model keys it chooses.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from zinfer.modelconfig.instances import InstanceGroup

__all__ = ["Need", "RateLimiter", "ResourceSpec", "needs_of", "normalize_device", "normalize_resources"]

ResourceSpec = tuple[str, int, str | None]
"""A pool size the server gives: resource name, count, and a device (``None``: every device and global)."""

PoolKey = tuple[str, str | None]  # (resource, device); device None is the global pool

K = TypeVar("K", bound=Hashable)  # an instance key
M = TypeVar("M", bound=Hashable)  # a model key (the unit that takes turns)

_GPU = re.compile(r"^(?:gpu:)?(\d+)$")


def normalize_device(device: str | None) -> str | None:
    """``cpu``, ``gpu:N`` (``N`` alone means ``gpu:N``) or None; raises ValueError for anything else."""
    if device is None or device == "":
        return None
    text = device.strip().lower()
    if text == "cpu":
        return "cpu"
    m = _GPU.fullmatch(text)
    if m is None:
        raise ValueError(f"not a device: {device!r} (expected 'cpu', 'gpu:N' or N)")
    return f"gpu:{int(m.group(1))}"


def normalize_resources(value: Iterable[ResourceSpec] | Mapping[str, int]) -> tuple[ResourceSpec, ...]:
    """Server pool sizes as ``(name, count, device)``; a mapping ``{name: count}`` gives every device."""
    items: Iterable[ResourceSpec] = (
        [(name, count, None) for name, count in value.items()] if isinstance(value, Mapping) else value
    )
    out: list[ResourceSpec] = []
    for name, count, device in items:
        if not isinstance(name, str) or not name:
            raise ValueError("a rate limiter resource needs a name")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"rate limiter resource {name!r}: count must be an integer >= 0")
        out.append((name, count, normalize_device(device)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Need:
    """``count`` copies of resource ``name``, from the instance's device pool or the global one."""

    name: str
    count: int
    is_global: bool = False


def needs_of(group: InstanceGroup | None) -> tuple[tuple[Need, ...], int]:
    """The resources an instance of ``group`` takes per batch, and its priority (at least 1)."""
    if group is None or group.rate_limiter is None:
        return (), 1
    rl = group.rate_limiter
    return tuple(Need(r.name, r.count, r.is_global) for r in rl.resources if r.count > 0), max(1, rl.priority)


@dataclass
class _Instance(Generic[M]):
    model: M
    device: str
    takes: dict[PoolKey, int]
    priority: int
    holding: bool = False


@dataclass
class _Pass:
    value: float = 0.0
    served: int = 0


@dataclass
class RateLimiter(Generic[K, M]):
    """Resource pools, the instances that draw on them, and whose turn it is."""

    resources: Sequence[ResourceSpec] = ()
    _given: dict[PoolKey, int] = field(default_factory=dict, init=False)
    _given_any: dict[str, int] = field(default_factory=dict, init=False)
    _instances: dict[K, _Instance[M]] = field(default_factory=dict, init=False)
    _held: dict[PoolKey, int] = field(default_factory=dict, init=False)
    _passes: dict[M, _Pass] = field(default_factory=dict, init=False)
    _now: float = field(default=0.0, init=False)  # the pass of the last model served (virtual time)

    def __post_init__(self) -> None:
        for name, count, device in normalize_resources(self.resources):
            if device is None:
                self._given_any[name] = count
            else:
                self._given[(name, device)] = count

    # ------------------------------------------------------------------------------------ pools

    def capacity(self, name: str, device: str | None) -> int:
        """Copies of ``name`` on ``device`` (None: the global pool)."""
        key = (name, device)
        if key in self._given:
            return self._given[key]
        if name in self._given_any:
            return self._given_any[name]
        return max((i.takes.get(key, 0) for i in self._instances.values()), default=0)

    def held(self, name: str, device: str | None) -> int:
        return self._held.get((name, device), 0)

    def pools(self) -> dict[PoolKey, tuple[int, int]]:
        """Every pool an instance draws on: (held, capacity)."""
        keys = {k for i in self._instances.values() for k in i.takes}
        return {k: (self._held.get(k, 0), self.capacity(*k)) for k in sorted(keys, key=str)}

    # ------------------------------------------------------------------------------------ instances

    def add(
        self, instance: K, model: M, device: str, needs: Sequence[Need] = (), priority: int = 1
    ) -> str | None:
        """Register an instance; returns why it can never run (a need larger than its pool), else None."""
        takes: dict[PoolKey, int] = {}
        for need in needs:
            if need.count <= 0:
                continue
            key = (need.name, None if need.is_global else device)
            takes[key] = takes.get(key, 0) + need.count
        self.remove(instance)
        self._instances[instance] = _Instance(model, device, takes, max(1, priority))
        for (name, dev), count in takes.items():
            capacity = self.capacity(name, dev)
            if count > capacity:
                where = "global" if dev is None else f"on {dev}"
                return (
                    f"rate limiter: an instance needs {count} of resource '{name}' ({where}), "
                    f"the server has {capacity}"
                )
        return None

    def remove(self, instance: K) -> None:
        """Forget an instance (it died or stopped), giving back what it held."""
        self.release(instance)
        self._instances.pop(instance, None)

    def known(self, instance: K) -> bool:
        return instance in self._instances

    def limits(self, instance: K) -> bool:
        """Whether the instance draws on any pool at all."""
        inst = self._instances.get(instance)
        return inst is not None and bool(inst.takes)

    def can_acquire(self, instance: K) -> bool:
        """Whether the instance's resources are all free now (an unknown instance needs none)."""
        inst = self._instances.get(instance)
        if inst is None or not inst.takes:
            return True
        if inst.holding:
            return False
        return all(self._held.get(k, 0) + n <= self.capacity(*k) for k, n in inst.takes.items())

    def acquire(self, instance: K) -> bool:
        """Take the instance's resources if they are all free; False (nothing taken) otherwise."""
        if not self.can_acquire(instance):
            return False
        inst = self._instances.get(instance)
        if inst is None:
            return True
        for k, n in inst.takes.items():
            self._held[k] = self._held.get(k, 0) + n
        inst.holding = True
        return True

    def release(self, instance: K) -> None:
        """Give back what the instance holds (nothing if it holds nothing)."""
        inst = self._instances.get(instance)
        if inst is None or not inst.holding:
            return
        for k, n in inst.takes.items():
            left = self._held.get(k, 0) - n
            if left > 0:
                self._held[k] = left
            else:
                self._held.pop(k, None)
        inst.holding = False

    def holding(self, instance: K) -> bool:
        inst = self._instances.get(instance)
        return inst is not None and inst.holding

    # ------------------------------------------------------------------------------------ turns

    def turn_order(self, models: Iterable[M]) -> list[M]:
        """``models`` (the ones with work waiting) in the order they should be offered the resources:
        lowest pass first, ties in the order given. A model back from an idle spell starts at the current
        pass."""
        ordered = []
        for index, model in enumerate(models):
            p = self._passes.setdefault(model, _Pass(self._now))
            if p.value < self._now:
                p.value = self._now
            ordered.append((p.value, index, model))
        ordered.sort(key=lambda t: (t[0], t[1]))
        return [m for _, _, m in ordered]

    def served(self, model: M, priority: int = 1) -> None:
        """``model`` was given a turn; its pass advances by its priority (a weight: 2 = half the turns)."""
        p = self._passes.setdefault(model, _Pass(self._now))
        self._now = max(self._now, p.value)
        p.value += max(1, priority)
        p.served += 1

    def priority_of(self, instance: K) -> int:
        inst = self._instances.get(instance)
        return inst.priority if inst is not None else 1

    def forget_model(self, model: M) -> None:
        """``model`` is gone for good (a retired load generation): its turns are no longer kept."""
        self._passes.pop(model, None)

    def models(self) -> set[M]:
        """The models whose turns are kept."""
        return set(self._passes)
