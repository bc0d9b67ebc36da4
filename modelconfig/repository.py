"""Scanning a model repository in Triton's layout.

::

    <root>/
      <model>/
        config.pbtxt
        1/            # numeric version folders; the version_policy picks which are served
        2/

Hidden entries (names starting with '.'), plain files at the top level and the server's own runtime
directory (when ``--runtime-dir`` points inside the repository) are ignored. A model that
cannot be loaded (its config does not parse, it uses features zinfer does not have yet, or its
version_policy selects no version folder) still gets a :class:`ModelEntry`, with ``error`` set, so one
bad model never stops the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from zinfer.client.errors import ConfigError

from .autocomplete import ONNX_DEFAULT_FILENAME, ONNX_PLATFORM, complete_config
from .backends import foreign_model_file, unsupported_backend
from .instances import InstanceGroup
from .model_config import CONFIG_FILENAME, ModelConfig, load_model_config, unsupported_features
from .model_files import check_label_files
from .parameters import check_parameters
from .python_autocomplete import PYTHON_DEFAULT_FILENAME
from .version_policy import VersionPolicy
from .warmup import check_warmup

__all__ = [
    "ModelEntry",
    "available_versions",
    "load_model_entry",
    "model_folder_names",
    "read_model_dir_config",
    "scan_repository",
    "select_versions",
]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model folder. ``versions`` are the ones its version_policy selects, ascending.

    ``error`` is ``None`` when the model can be served. With an error, ``config`` is still set when the
    config itself was valid (e.g. "not supported yet: ..."), and ``versions`` when they could be chosen.
    """

    name: str
    path: Path
    config: ModelConfig | None
    versions: tuple[int, ...]
    error: str | None = None


def available_versions(model_dir: Path) -> tuple[int, ...]:
    """The version folders of a model, ascending: sub-folders whose names are all digits."""
    found: dict[int, str] = {}
    for child in model_dir.iterdir():
        name = child.name
        if not (name.isascii() and name.isdigit()) or not child.is_dir():
            continue
        version = int(name)
        if version in found:
            raise ConfigError(
                f"{model_dir}: folders '{found[version]}' and '{name}' are both version {version}"
            )
        found[version] = name
    return tuple(sorted(found))


def select_versions(policy: VersionPolicy, available: Iterable[int], model_dir: Path) -> tuple[int, ...]:
    """The versions ``policy`` serves out of ``available``; a missing ``specific`` version is an error."""
    have = sorted(set(available))
    if policy.kind == "all":
        return tuple(have)
    if policy.kind == "latest":
        return tuple(have[-policy.num_versions :]) if have else ()
    missing = [version for version in policy.versions if version not in have]
    if missing:
        listed = ", ".join(str(v) for v in missing)
        raise ConfigError(f"{model_dir}: version_policy names version {listed}, which has no folder")
    return tuple(sorted(policy.versions))


def read_model_dir_config(model_dir: Path) -> ModelConfig:
    """The folder's ``config.pbtxt``; without one, as Triton, the config its newest version folder's model
    file implies: ``model.py`` a python model (which its ``auto_complete_config`` may complete),
    ``model.onnx`` an ONNX one (completed from the graph). A config.pbtxt that names no backend, platform
    or ensemble gets them from that file the same way (Triton's config overrides such as
    ``{"max_batch_size": 16}`` are such configs). Anything else is a ConfigError."""
    config_path = model_dir / CONFIG_FILENAME
    config = load_model_config(config_path, model_dir.name) if config_path.is_file() else None
    if config is not None and (config.backend or config.platform or config.ensemble_scheduling is not None):
        return config
    try:
        versions = available_versions(model_dir)
    except OSError:
        versions = ()
    newest = model_dir / str(versions[-1]) if versions else None
    if config is not None:
        if newest is None:
            return config
        if (newest / PYTHON_DEFAULT_FILENAME).is_file():
            return replace(config, backend="python")
        if (newest / ONNX_DEFAULT_FILENAME).is_file():
            return replace(config, platform=ONNX_PLATFORM)
        return config
    groups = (InstanceGroup(name=model_dir.name),)
    if newest is not None and (newest / PYTHON_DEFAULT_FILENAME).is_file():
        return ModelConfig(name=model_dir.name, backend="python", instance_group=groups)
    if newest is not None and (newest / ONNX_DEFAULT_FILENAME).is_file():
        return ModelConfig(name=model_dir.name, platform=ONNX_PLATFORM, instance_group=groups)
    foreign = foreign_model_file(newest) if newest is not None else None
    if foreign is not None:
        raise ConfigError(foreign)
    raise ConfigError(
        f"{model_dir}: no {CONFIG_FILENAME} (and no {PYTHON_DEFAULT_FILENAME} or {ONNX_DEFAULT_FILENAME} in "
        "the newest version folder to complete one from)"
    )


def load_model_entry(model_dir: Path) -> ModelEntry:
    """Load one model folder into a :class:`ModelEntry`; never raises for a bad model."""
    name = model_dir.name
    try:
        config = read_model_dir_config(model_dir)
    except ConfigError as exc:
        return ModelEntry(name, model_dir, None, (), str(exc))
    backend_problem = unsupported_backend(config)  # first: before any complaint about its fields or GPUs
    if backend_problem is not None:
        return ModelEntry(name, model_dir, config, (), backend_problem)
    try:
        check_parameters(config)
    except ConfigError as exc:
        return ModelEntry(name, model_dir, None, (), str(exc))
    error: str | None = None
    unsupported = unsupported_features(config)
    if unsupported:
        error = f"not supported yet: {', '.join(unsupported)}"
    try:
        versions = select_versions(config.version_policy, available_versions(model_dir), model_dir)
    except (ConfigError, OSError) as exc:
        return ModelEntry(name, model_dir, config, (), error or str(exc))
    if not versions and error is None:
        error = (
            f"{model_dir}: no version folder (such as {model_dir / '1'}) is selected by the version_policy"
        )
    if versions and error is None:
        try:
            config = complete_config(config, model_dir, versions[-1])
            check_warmup(config)
            check_label_files(config, model_dir)
        except ConfigError as exc:
            return ModelEntry(name, model_dir, config, versions, str(exc))
    return ModelEntry(name, model_dir, config, versions, error)


def model_folder_names(root: Path, runtime_dir: Path | None = None) -> list[str]:
    """The names of ``root``'s model folders, sorted: folders not hidden, and not the server's own runtime
    directory when that was put inside the repository (its sockets and lock are no model)."""
    skip = runtime_dir.resolve() if runtime_dir is not None else None
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (skip is None or p.resolve() != skip)
    )


def scan_repository(root: Path) -> list[ModelEntry]:
    """Every model folder under ``root``, sorted by name; a missing ``root`` is a :class:`ConfigError`."""
    if not root.is_dir():
        raise ConfigError(f"{root}: the model repository is not a folder")
    entries: list[ModelEntry] = []
    for child in sorted(root.iterdir(), key=lambda p: p.name):
        if child.name.startswith(".") or not child.is_dir():
            continue
        entries.append(load_model_entry(child))
    return entries
