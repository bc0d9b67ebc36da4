"""The models a server serves: every version's state, the models that failed to load, and lookup by name.

A load builds new states first (``prepare``) and only an ``install`` makes them serve; the states they
replace, and the states of an unloaded model, move to ``retiring``: they take no new requests, finish what
they have queued, and then their workers stop.

The broker loop's per-turn work (queue timeouts, dispatch, the next deadline) walks only the states that
have work (``working``): a state joins when a request is queued to it (``has_work``) and leaves once it
has none, so a turn costs the same with three models as with three hundred.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from zinfer.client.errors import ConfigError, NotFound, Unavailable
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.repository import ModelEntry, load_model_entry

from .devices import GpuProbe, gpu_probe
from .ensemble_plan import build_plan
from .model_state import ModelState

log = logging.getLogger(__name__)


def place_instances(config: ModelConfig, gpus: GpuProbe | None = None) -> list[str] | str:
    """One device per instance (``cpu`` or ``gpu:<index>``), or an error text when they cannot be placed.

    KIND_GPU: ``count`` instances on each GPU the group lists (every usable GPU when it lists none);
    KIND_CPU and KIND_MODEL: ``count`` on the CPU; KIND_AUTO: like KIND_GPU when a GPU is usable (or the
    group lists GPUs), else on the CPU. ``gpus`` is what :func:`zinfer.broker.devices.gpu_probe` found;
    it is asked only when a group could go to a GPU.
    """
    devices: list[str] = []
    for group in config.instance_group:
        if group.kind in ("KIND_CPU", "KIND_MODEL"):
            devices.extend(["cpu"] * group.count)
            continue
        probe = gpus if gpus is not None else gpu_probe()
        if group.kind == "KIND_AUTO" and not probe.ids and not group.gpus:
            devices.extend(["cpu"] * group.count)
            continue
        if not probe.ids:
            return f"instance_group '{group.name}': {group.kind} but no usable GPU: {probe.reason}"
        targets = list(group.gpus) or list(probe.ids)
        missing = [g for g in targets if g not in probe.ids]
        if missing:
            usable = ", ".join(str(g) for g in probe.ids)
            listed = ", ".join(str(g) for g in missing)
            return f"instance_group '{group.name}': gpus [{listed}] not usable (usable GPUs: [{usable}])"
        for gpu in targets:
            devices.extend([f"gpu:{gpu}"] * group.count)
    return devices or ["cpu"]


def restrict_gpus(probe: GpuProbe, allowed: tuple[int, ...] | None) -> GpuProbe:
    """The probe limited to the server's ``gpus`` setting (indices after CUDA_VISIBLE_DEVICES)."""
    if allowed is None:
        return probe
    ids = tuple(g for g in probe.ids if g in allowed)
    names = tuple(n for g, n in zip(probe.ids, probe.names, strict=False) if g in allowed)
    reason = probe.reason or (f"the server's gpus setting {list(allowed)} leaves none" if not ids else "")
    return GpuProbe(ids, names, reason)


class ModelRegistry:
    def __init__(self, gpus: tuple[int, ...] | None = None) -> None:
        self.allowed_gpus = gpus
        self.models: dict[str, dict[int, ModelState]] = {}
        self.load_errors: dict[str, str] = {}  # models that have no serving version, and why
        self.reload_errors: dict[str, str] = {}  # the last failed reload of a model that still serves
        self.retiring: list[ModelState] = []
        # states that may have queued requests, expired ones to answer, or open sequences (whose idle limit
        # runs on time), in the order they got work; a dict as an ordered set
        self._work: dict[ModelState, None] = {}
        self.loading: set[str] = set()  # models with a load in progress
        self.known: set[str] = set()  # every model folder of the repository seen so far
        self._generations = itertools.count(1)

    def prepare(
        self, entry: ModelEntry, max_batch_bytes: int = 0
    ) -> tuple[list[tuple[ModelState, list[str]]], str | None]:
        """New states for every version of ``entry`` with their devices, or the reason it cannot load;
        ``max_batch_bytes`` bounds the input bytes of one of their batches (0: no limit)."""
        if entry.error is not None or entry.config is None:
            return [], entry.error or "invalid model"
        if entry.config.platform == "ensemble" or entry.config.ensemble_scheduling is not None:
            return self._prepare_ensemble(entry, entry.config)
        probe = None
        if self.allowed_gpus is not None and any(
            g.kind in ("KIND_GPU", "KIND_AUTO") for g in entry.config.instance_group
        ):
            probe = restrict_gpus(gpu_probe(), self.allowed_gpus)
        devices = place_instances(entry.config, probe)
        if isinstance(devices, str):
            return [], devices
        generation = next(self._generations)
        prepared = []
        for version in entry.versions:
            state = ModelState(
                entry.config, version, entry.path / str(version), len(devices), max_batch_bytes
            )
            state.generation = generation
            prepared.append((state, devices))
        return prepared, None

    def _prepare_ensemble(
        self, entry: ModelEntry, config: ModelConfig
    ) -> tuple[list[tuple[ModelState, list[str]]], str | None]:
        """An ensemble's states (no instances), once its plan checks out against its steps' configs."""
        root = entry.path.parent

        def lookup(name: str) -> ModelConfig | str:
            step = load_model_entry(root / name) if (root / name).is_dir() else None
            if step is None:
                return "no such model in the repository"
            if step.config is None:
                return step.error or "invalid model"
            return step.config

        try:
            plan = build_plan(config, lookup)
        except ConfigError as exc:
            return [], str(exc)
        generation = next(self._generations)
        prepared: list[tuple[ModelState, list[str]]] = []
        for version in entry.versions:
            state = ModelState(config, version, entry.path / str(version), 0, plan=plan)
            state.generation = generation
            prepared.append((state, []))
        return prepared, None

    def install(self, name: str, states: list[ModelState]) -> None:
        """Make ``states`` the serving versions of ``name``; the ones they replace start retiring."""
        old = self.models.pop(name, {})
        for state in states:
            previous = old.get(state.version)
            if previous is not None:  # statistics of a version go on across a reload
                state.stats = previous.stats
                state.window = previous.window
        self.retire(list(old.values()))
        self.models[name] = {s.version: s for s in states}
        self.load_errors.pop(name, None)
        self.reload_errors.pop(name, None)

    def fail(self, name: str, reason: str) -> None:
        if name in self.models:
            self.reload_errors[name] = reason
        else:
            self.load_errors[name] = reason

    def remove(self, name: str) -> bool:
        """Unload: every version of ``name`` starts retiring. False if it was not loaded."""
        old = self.models.pop(name, None)
        self.reload_errors.pop(name, None)
        if old is None:
            return False
        for state in old.values():
            state.metrics.remove()
        self.retire(list(old.values()))
        return True

    def retire(self, states: list[ModelState]) -> None:
        for state in states:
            state.retired = True
            self.retiring.append(state)

    def all_ready(self) -> bool:
        """Triton's strict readiness: every model that should be loaded is ready. A model whose load failed
        (a bad config, an ``initialize`` that raised, a load asked for in explicit mode) or whose instances
        failed for good (``error`` set) makes the server not ready; a model never asked for (explicit mode)
        or unloaded on request does not count."""
        return not self.load_errors and all(s.ready for s in self.serving())

    def has_work(self, state: ModelState) -> None:
        """A request was queued to ``state``: the loop looks at it each turn until it has no work."""
        self._work[state] = None

    def working(self) -> list[ModelState]:
        """The states with work, in the order they got it; those found without any leave the set."""
        out: list[ModelState] = []
        done: list[ModelState] = []
        for state in self._work:
            if state.scheduler.has_work():
                out.append(state)
            else:
                done.append(state)
        for state in done:
            del self._work[state]
        return out

    def drop_retired(self, state: ModelState) -> None:
        """A retired state whose workers have stopped: gone for good."""
        self.retiring.remove(state)
        self._work.pop(state, None)

    def serving(self) -> Iterator[ModelState]:
        for versions in self.models.values():
            yield from versions.values()

    def states(self) -> Iterator[ModelState]:
        """Every state that may still have work: serving and retiring."""
        yield from self.serving()
        yield from self.retiring

    def resolve(self, name: str, version: int) -> ModelState:
        """A model version by name; version 0 is the newest ready version (else the newest)."""
        versions = self.models.get(name)
        if (
            not versions
        ):  # the texts start as Triton's (ModelRepositoryManager::GetModel), which clients match
            unavailable = f"Request for unknown model: '{name}' has no available versions"
            if name in self.loading:
                raise Unavailable(f"{unavailable}: it is loading")
            if name in self.load_errors:
                raise Unavailable(f"{unavailable}: it failed to load: {self.load_errors[name]}")
            if name in self.known:
                raise Unavailable(f"{unavailable}: it is not loaded")
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            state = versions.get(version)
            if state is None:
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
            return state
        if len(versions) == 1:  # the one version, ready or not
            for state in versions.values():
                return state
        ready = [v for v, s in versions.items() if s.ready]
        return versions[max(ready) if ready else max(versions)]
