"""Build the model a worker runs from its config, on its device.

``backend: "zinfer"`` picks a built-in kernel (``zinfer.workers.kernels``); ``backend: "python"`` runs the
version folder's ``model.py`` (``zinfer.workers.python_model``); ``platform: "onnxruntime_onnx"`` or
``backend: "onnxruntime"`` runs an ONNX model through ONNX Runtime (``zinfer.workers.onnx_model``).
Every failure is a ConfigError whose text names the model and, where there is one, the file and the
exception; the worker sends it to the broker, which marks that model unavailable with it and keeps
serving the others.
"""

from __future__ import annotations

from pathlib import Path

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.autocomplete import is_onnx
from zinfer.modelconfig.backends import unsupported_backend
from zinfer.modelconfig.model_config import ModelConfig

from .device import CPU, Device
from .kernels import load_kernel
from .model import AnyModel
from .model_loop import ModelThreads
from .python_model import load_python_model


def load_model(
    config: ModelConfig,
    version_dir: Path,
    device: Device = CPU,
    instance: int = 0,
    threads: ModelThreads | None = None,
) -> AnyModel:
    if config.backend == "zinfer":
        return load_kernel(config, version_dir, device)
    if config.backend == "python":
        return load_python_model(config, version_dir, device, instance, threads)
    if is_onnx(config):
        from .onnx_model import load_onnx_model  # onnxruntime is imported only by the models that use it

        return load_onnx_model(config, version_dir, device)
    raise ConfigError(unsupported_backend(config) or f"model {config.name!r}: no backend to run it")
