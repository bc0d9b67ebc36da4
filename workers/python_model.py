"""Model code: ``backend: "python"`` runs the ``model.py`` of the version folder.

The file is imported as a module of its own, with the version folder first on ``sys.path`` (so it can
import its neighbours) and as the module's package path (so relative imports, ``from .helper import x``,
work as they do in Triton), and ``triton_python_backend_utils`` importable. Then:

- a class named ``TritonPythonModel`` runs the Triton way (``zinfer.workers.triton_model``): ``execute``
  receives the batch as a list of requests and returns one response per request;
- otherwise the class named ``Model``, or else the one class of the file that has an ``execute`` method,
  runs the native way: ``initialize(config)`` once, ``execute(inputs) -> outputs`` with the whole batch
  as arrays by tensor name (NumPy on CPU instances, CuPy on GPU instances), ``finalize()`` at the end.

A file that cannot be imported, a class that cannot be found, and an ``initialize`` that raises each
fail the load with an error naming the file, the exception and the line.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig

from . import triton_python_backend_utils
from .device import Device
from .model import Array, Model, RequestModel
from .model_loop import ModelThreads

DEFAULT_FILENAME = "model.py"


def where_in(path: Path, exc: BaseException) -> str:
    """`` (line N)`` for the innermost frame of ``exc`` in ``path``, or ``""``."""
    if isinstance(exc, SyntaxError) and exc.filename == str(path) and exc.lineno:
        return f" (line {exc.lineno})"
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == str(path):
            line = frame.lineno
    return f" (line {line})" if line else ""


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def model_file(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or DEFAULT_FILENAME)


def import_model_file(path: Path, config: ModelConfig, version: str) -> ModuleType:
    """Import ``path`` as a fresh module; any failure is a ConfigError naming the file and line."""
    if not path.is_file():
        raise ConfigError(f"model {config.name!r}: backend 'python' needs {path}: not found")
    sys.modules.setdefault("triton_python_backend_utils", triton_python_backend_utils)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = "zinfer_model_" + re.sub(r"\W", "_", f"{config.name}_{version}")
    # a package over the version folder, so that ``from .helper import x`` finds the folder's helper.py
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[folder])
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise ConfigError(f"{path}: import failed: {describe(exc)}{where_in(path, exc)}") from None
    return module


def find_model_class(module: ModuleType, path: Path) -> tuple[type, bool]:
    """The model class and whether it is Triton-style."""
    triton = getattr(module, "TritonPythonModel", None)
    if isinstance(triton, type):
        return triton, True
    native = getattr(module, "Model", None)
    if isinstance(native, type):
        return native, False
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and callable(getattr(obj, "execute", None))
    ]
    if len(found) == 1:
        return found[0], False
    names = ", ".join(sorted(c.__name__ for c in found)) or "none"
    raise ConfigError(
        f"{path}: cannot tell which class is the model: name it Model (or TritonPythonModel for the "
        f"Triton API), or define exactly one class with an execute method (found: {names})"
    )


def native_config(config: ModelConfig, version_dir: Path, device: Device, instance: int) -> dict[str, Any]:
    """What ``initialize(config)`` receives: the config in Triton's JSON form, plus where it runs."""
    d = config.to_dict()
    d.update(
        {
            "device": device.spec,
            "device_kind": device.kind,
            "device_id": device.id,
            "model_instance": instance,
            "model_version": int(version_dir.name) if version_dir.name.isdigit() else version_dir.name,
            "model_repository": str(version_dir.parent),
            "version_dir": str(version_dir),
        }
    )
    return d


def call_hook(path: Path, instance: Any, hook: str, *args: Any) -> Any:
    """Call ``instance.<hook>(*args)`` if it exists; a failure is a ConfigError naming file and line."""
    method = getattr(instance, hook, None)
    if method is None:
        return None
    try:
        if args and _takes_no_arguments(method):
            return method()
        return method(*args)
    except (Exception, SystemExit) as exc:
        cls = type(instance).__name__
        raise ConfigError(f"{path}: {cls}.{hook} raised {describe(exc)}{where_in(path, exc)}") from None


def _takes_no_arguments(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(p.kind is not p.KEYWORD_ONLY for p in params)


class PythonModel:
    """A native model class behind the :class:`Model` interface."""

    def __init__(self, instance: Any, path: Path) -> None:
        self.instance = instance
        self.path = path
        self._execute = instance.execute

    def execute(self, inputs: Mapping[str, Array], /) -> Mapping[str, Array]:
        result: Mapping[str, Array] = self._execute(dict(inputs))
        return result

    def finalize(self) -> None:
        finalize = getattr(self.instance, "finalize", None)
        if finalize is not None:
            finalize()


def load_python_model(
    config: ModelConfig,
    version_dir: Path,
    device: Device,
    instance: int = 0,
    threads: ModelThreads | None = None,
) -> Model | RequestModel:
    """``threads``: where a Triton-style model's ``execute`` runs (the worker runtime's; its own if None)."""
    path = model_file(config, version_dir)
    module = import_model_file(path, config, version_dir.name)
    cls, triton_style = find_model_class(module, path)
    try:
        obj = cls()
    except Exception as exc:
        raise ConfigError(f"{path}: {cls.__name__}() raised {describe(exc)}{where_in(path, exc)}") from None
    if triton_style:
        from .triton_model import TritonModel, initialize_args

        args = initialize_args(config, version_dir, device, instance)
        call_hook(path, obj, "initialize", args)
        return TritonModel(obj, path, config, args["model_instance_name"], threads)
    if not callable(getattr(obj, "execute", None)):
        raise ConfigError(f"{path}: class {cls.__name__} has no execute method")
    call_hook(path, obj, "initialize", native_config(config, version_dir, device, instance))
    return PythonModel(obj, path)
