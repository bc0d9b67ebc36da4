"""Which of Triton's backends and platforms zinfer runs, and the message for the ones it does not.

A model's backend is checked when its folder is read, before its instances are placed on devices, so a
Triton user with a TensorRT or PyTorch model learns that the platform is not supported before anything
about GPUs or CuPy (``docs/from-triton.md`` says what runs unchanged and what to convert).
"""

from __future__ import annotations

from pathlib import Path

from .model_config import ModelConfig

__all__ = ["SUPPORTED_BACKENDS", "SUPPORTED_PLATFORMS", "foreign_model_file", "unsupported_backend"]

SUPPORTED_BACKENDS = ("zinfer", "python", "onnxruntime")
SUPPORTED_PLATFORMS = ("onnxruntime_onnx", "ensemble")

# Triton's backends and platforms zinfer does not run, by name (backend or platform), with what to do
_FOREIGN = {
    "tensorrt_plan": "TensorRT",
    "tensorrt": "TensorRT",
    "pytorch_libtorch": "PyTorch (TorchScript)",
    "pytorch": "PyTorch",
    "tensorflow_graphdef": "TensorFlow",
    "tensorflow_savedmodel": "TensorFlow",
    "tensorflow": "TensorFlow",
    "openvino": "OpenVINO",
    "dali": "DALI",
    "fil": "FIL",
    "vllm": "vLLM",
    "tensorrtllm": "TensorRT-LLM",
}
# the default model file names of those backends, for a model folder that has no config.pbtxt
_FOREIGN_FILES = {
    "model.plan": "tensorrt_plan",
    "model.pt": "pytorch_libtorch",
    "model.graphdef": "tensorflow_graphdef",
    "model.savedmodel": "tensorflow_savedmodel",
    "model.xml": "openvino",
}
_WHAT_RUNS = (
    'zinfer runs backend: "python" (a model.py, Triton\'s python backend API included), '
    'platform: "onnxruntime_onnx" (a model.onnx), ensembles, and backend: "zinfer" built-in kernels; '
    "see docs/from-triton.md"
)


def _advice(name: str) -> str:
    family = _FOREIGN.get(name)
    if family is None:
        return _WHAT_RUNS
    if family in ("PyTorch", "PyTorch (TorchScript)", "TensorFlow"):
        return f"export the {family} model to ONNX, or call it from a python model; {_WHAT_RUNS}"
    if family == "TensorRT":
        return f"serve the ONNX model the plan was built from; {_WHAT_RUNS}"
    return _WHAT_RUNS


def unsupported_backend(config: ModelConfig) -> str | None:
    """Why zinfer cannot run ``config``'s backend or platform, or None when it can."""
    if config.backend in SUPPORTED_BACKENDS or config.platform in SUPPORTED_PLATFORMS:
        return None
    if not config.backend and not config.platform:
        if config.ensemble_scheduling is not None:
            return None
        return f"model {config.name!r}: the config names no backend and no platform ({_WHAT_RUNS})"
    kind, name = ("backend", config.backend) if config.backend else ("platform", config.platform)
    return f"model {config.name!r}: {kind} {name!r} is not supported by zinfer ({_advice(name)})"


def foreign_model_file(version_dir: Path) -> str | None:
    """For a model folder without ``config.pbtxt``: the message for a model file of a backend zinfer does
    not run (``model.plan``, ``model.pt``, ...) found in ``version_dir``, or None."""
    for filename, platform in _FOREIGN_FILES.items():
        if (version_dir / filename).exists():
            return (
                f"{version_dir / filename}: a {_FOREIGN[platform]} model ({platform}) is not supported by "
                f"zinfer ({_advice(platform)})"
            )
    return None
