"""What a request for a model needs loaded, read from the registry or the repository's folders: the model
itself and, for an ensemble, every step model (steps of steps too); where its instances would go (for a
footprint estimate before its first load); whether it is pinned; the metadata of a model not loaded yet.
For on-demand model control (``on_demand``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from zinfer.client import protocol
from zinfer.client.protocol import Command
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.repository import load_model_entry

from .handlers import config_metadata
from .registry import ModelRegistry

__all__ = ["PINNED_PARAMETER", "config_of", "devices_of", "needs", "pinned", "unloaded_info"]

PINNED_PARAMETER = "zinfer_pinned"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")  # a folder name, never a path


def pinned(config: ModelConfig) -> bool:
    """``parameters { key: "zinfer_pinned" value: { string_value: "true" } }``: never unloaded for room."""
    return config.parameters.get(PINNED_PARAMETER, "").strip().lower() in ("true", "1", "yes")


def config_of(registry: ModelRegistry, repository: Path, name: str) -> ModelConfig | None:
    """The loaded model's config, else its folder's; None for a name the repository does not have (a
    folder added since the server started counts: it becomes known)."""
    versions = registry.models.get(name)
    if versions:
        return next(iter(versions.values())).config
    if name not in registry.known:
        if not _MODEL_NAME.fullmatch(name) or name in (".", "..") or not (repository / name).is_dir():
            return None
        registry.known.add(name)
    if not (repository / name).is_dir():
        return None
    return load_model_entry(repository / name).config


def needs(registry: ModelRegistry, repository: Path, name: str) -> set[str] | None:
    """``name`` and, for an ensemble, every step model; None if ``name`` is not in the repository."""
    out: set[str] = set()
    todo = [name]
    while todo:
        n = todo.pop()
        if n in out:
            continue
        config = config_of(registry, repository, n)
        if config is None:
            if n == name:
                return None
            continue  # a step that does not exist: the ensemble's load says so
        out.add(n)
        if config.ensemble_scheduling is not None:
            todo.extend(step.model_name for step in config.ensemble_scheduling.step)
    return out


def devices_of(config: ModelConfig | None) -> list[str]:
    """Where the instances would go, as far as the config says: ``cpu`` or ``gpu:N`` per instance (a GPU
    group listing no GPUs counted on GPU 0); none for an ensemble."""
    if config is None or config.ensemble_scheduling is not None or config.platform == "ensemble":
        return []
    devices: list[str] = []
    for group in config.instance_group:
        if group.kind in ("KIND_CPU", "KIND_MODEL"):
            devices += ["cpu"] * group.count
        else:
            devices += [f"gpu:{g}" for g in (group.gpus or (0,)) for _ in range(group.count)]
    return devices or ["cpu"]


def unloaded_info(registry: ModelRegistry, repository: Path, command: Command, header: dict[str, Any]) -> Any:
    """MODEL_METADATA or MODEL_CONFIG of a model that is not loaded, from its folder (a client asks for them
    before its first request, which loads it); None: another command, or the model is loaded or unknown
    (the server's queries answer those)."""
    if command not in (Command.MODEL_METADATA, Command.MODEL_CONFIG):
        return None
    q = protocol.model_query_from_wire(header)
    if q.model in registry.models or config_of(registry, repository, q.model) is None:
        return None
    entry = load_model_entry(repository / q.model)
    if entry.config is None or entry.error is not None or (q.version and q.version not in entry.versions):
        return None
    if command == Command.MODEL_CONFIG:
        return entry.config.to_dict()
    return config_metadata(entry.config, list(entry.versions))
