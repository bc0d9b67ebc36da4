"""The models a server serves: every version's state, the models that failed to load, and lookup by name."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from zinfer.client.errors import NotFound, Unavailable

from .model_config import ModelConfig
from .model_state import ModelState
from .repository import scan_repository

log = logging.getLogger(__name__)


def place_instances(config: ModelConfig) -> list[str] | str:
    """One device per instance (``cpu`` here), or an error text when the instance groups cannot be placed."""
    devices: list[str] = []
    for group in config.instance_group:
        if group.kind == "KIND_GPU":
            return "instance_group kind KIND_GPU is not supported yet (no GPU workers in this build)"
        devices.extend(["cpu"] * group.count)
    return devices or ["cpu"]


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, dict[int, ModelState]] = {}
        self.load_errors: dict[str, str] = {}

    def load(self, repository: Path) -> list[tuple[ModelState, list[str]]]:
        """Scan ``repository``; returns each loadable model version with the devices of its instances."""
        to_start: list[tuple[ModelState, list[str]]] = []
        for entry in scan_repository(repository):
            if entry.error is not None or entry.config is None:
                self.load_errors[entry.name] = entry.error or "invalid model"
                log.error("event=model_load_failed model=%s error=%r", entry.name, entry.error)
                continue
            devices = place_instances(entry.config)
            versions = self.models.setdefault(entry.name, {})
            for version in entry.versions:
                state = ModelState(entry.config, version, entry.path / str(version), len(devices))
                versions[version] = state
                if isinstance(devices, str):
                    state.error = devices
                    log.error(
                        "event=model_load_failed model=%s version=%d error=%r", entry.name, version, devices
                    )
                else:
                    to_start.append((state, devices))
        return to_start

    def states(self) -> Iterator[ModelState]:
        for versions in self.models.values():
            yield from versions.values()

    def resolve(self, name: str, version: int) -> ModelState:
        """A model version by name; version 0 is the newest ready version (else the newest)."""
        versions = self.models.get(name)
        if not versions:
            if name in self.load_errors:
                raise Unavailable(f"model '{name}' failed to load: {self.load_errors[name]}")
            raise NotFound(f"unknown model '{name}'")
        if version:
            state = versions.get(version)
            if state is None:
                raise NotFound(f"unknown version {version} of model '{name}'")
            return state
        ready = [v for v, s in versions.items() if s.ready]
        return versions[max(ready) if ready else max(versions)]
