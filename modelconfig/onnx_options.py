"""The ONNX Runtime options an ONNX model's config.pbtxt sets, read and checked as Triton's onnxruntime
backend reads them, without onnxruntime (the broker checks them at load; the worker applies them).

``optimization { graph { level } }``: ``-1`` basic, ``1`` basic and extended, ``2`` none, ``0`` (or no
``graph`` block) all of them (ONNX Runtime's ``GraphOptimizationLevel``). ``parameters`` keys, each a
string as every parameter is:

================================================  ==========================================================
``intra_op_thread_count``                         ``SessionOptions.intra_op_num_threads`` (0: ORT's default)
``inter_op_thread_count``                         ``SessionOptions.inter_op_num_threads`` (0: ORT's default)
``execution_mode``                                ``0`` sequential, ``1`` parallel
``enable_mem_arena``                              ``SessionOptions.enable_cpu_mem_arena``
``enable_mem_pattern``                            ``SessionOptions.enable_mem_pattern``
``session.use_device_allocator_for_initializers`` a session config entry, ``0`` or ``1``
``memory.enable_memory_arena_shrinkage``          a run config entry: ``cpu:0``, ``gpu:<id>``, ``;``-separated
``share_session_between_instances``               accepted, no effect: every instance is its own process
``cudnn_conv_algo_search``, ``gpu_mem_limit``,    options of the CUDA execution provider, used by KIND_GPU
``arena_extend_strategy``,                        instances only (ignored on the CPU, as Triton does)
``do_copy_in_default_stream``
================================================  ==========================================================

Other keys are left alone, as Triton leaves them (zinfer's own keys, such as ``execution_timeout_ms``, live
in the same map). A bad value of a key above, a graph level other than -1, 0, 1 or 2, and any
``optimization { execution_accelerators }`` (TensorRT, OpenVINO, CUDA options: zinfer runs ONNX Runtime's
CPU provider, and its CUDA provider on KIND_GPU) are ConfigErrors naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from zinfer.client.errors import ConfigError

from .model_config import ModelConfig
from .record_base import empty_map, frozen_map

__all__ = ["GRAPH_LEVELS", "OnnxSessionOptions", "onnx_session_options"]

# Triton's optimization.graph.level -> ONNX Runtime's GraphOptimizationLevel member
GRAPH_LEVELS: dict[int, str] = {
    -1: "ORT_ENABLE_BASIC",
    0: "ORT_ENABLE_ALL",
    1: "ORT_ENABLE_EXTENDED",
    2: "ORT_DISABLE_ALL",
}

_EXECUTION_MODES = {"0": "ORT_SEQUENTIAL", "1": "ORT_PARALLEL"}
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")
_MAX_DIGITS = 20

SHRINKAGE = "memory.enable_memory_arena_shrinkage"
DEVICE_ALLOCATOR = "session.use_device_allocator_for_initializers"


@dataclass(frozen=True, slots=True)
class OnnxSessionOptions:
    """What the worker sets on ``onnxruntime.SessionOptions``/``RunOptions`` (None: ORT's default)."""

    graph_optimization_level: str = "ORT_ENABLE_ALL"
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    execution_mode: str = "ORT_SEQUENTIAL"
    enable_cpu_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    session_config: Mapping[str, str] = field(default_factory=empty_map)
    # memory.enable_memory_arena_shrinkage's entries, e.g. ("cpu:0", "gpu:0")
    arena_shrinkage: tuple[str, ...] = ()
    cuda_provider_options: Mapping[str, str] = field(default_factory=empty_map)

    def shrinkage_for(self, on_gpu: bool) -> str:
        """The run config entry for an instance on the CPU (only its ``cpu:`` entries) or on a GPU."""
        return ";".join(e for e in self.arena_shrinkage if on_gpu or e.startswith("cpu:"))


def _where(config: ModelConfig, key: str) -> str:
    return f"model {config.name!r}: parameter {key}"


def _count(config: ModelConfig, key: str, raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
        raise ConfigError(f"{_where(config, key)} must be a whole number >= 0, got {raw!r}")
    return int(text)


def _flag(config: ModelConfig, key: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{_where(config, key)} must be 1 or 0 (true or false), got {raw!r}")


def _choice(config: ModelConfig, key: str, raw: str, allowed: Mapping[str, str]) -> str:
    value = allowed.get(raw.strip())
    if value is None:
        raise ConfigError(f"{_where(config, key)} must be one of {', '.join(allowed)}, got {raw!r}")
    return value


def _shrinkage(config: ModelConfig, raw: str) -> tuple[str, ...]:
    entries = tuple(e.strip() for e in raw.split(";") if e.strip())
    for entry in entries:
        device, _, number = entry.partition(":")
        if device not in ("cpu", "gpu") or not (number.isascii() and number.isdigit() and len(number) < 6):
            raise ConfigError(
                f"{_where(config, SHRINKAGE)} must list devices as cpu:0 or gpu:<id>, separated by ';', "
                f"got {raw!r}"
            )
        if device == "cpu" and int(number) != 0:
            raise ConfigError(f"{_where(config, SHRINKAGE)}: the CPU is cpu:0, got {entry!r}")
    return entries


_CUDA_CHOICES: dict[str, dict[str, str]] = {
    "cudnn_conv_algo_search": {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"},
    "arena_extend_strategy": {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"},
    "do_copy_in_default_stream": {"0": "0", "1": "1"},
}


def _accelerators_refused(config: ModelConfig) -> None:
    accelerators = config.optimization.execution_accelerators
    if accelerators is None:
        return
    named = [f"gpu_execution_accelerator {a.name!r}" for a in accelerators.gpu_execution_accelerator]
    named += [f"cpu_execution_accelerator {a.name!r}" for a in accelerators.cpu_execution_accelerator]
    raise ConfigError(
        f"model {config.name!r}: optimization.execution_accelerators ({', '.join(named) or 'empty'}) is not "
        "supported: zinfer's onnxruntime backend runs ONNX Runtime's CPU execution provider, and its CUDA "
        "provider on KIND_GPU instances (no TensorRT or OpenVINO, no CUDA provider options from here); "
        "remove the block"
    )


def onnx_session_options(config: ModelConfig) -> OnnxSessionOptions:
    """The options of an ONNX model's config, checked; a ConfigError names a bad one."""
    _accelerators_refused(config)
    level = config.optimization.graph_level
    graph_level = GRAPH_LEVELS.get(0 if level is None else level)
    if graph_level is None:
        raise ConfigError(
            f"model {config.name!r}: optimization.graph.level {level} is not one Triton's onnxruntime "
            "backend knows: -1 (basic), 1 (basic and extended), 2 (none), 0 or unset (all)"
        )
    p = config.parameters
    session_config: dict[str, str] = {}
    if DEVICE_ALLOCATOR in p:
        session_config[DEVICE_ALLOCATOR] = (
            "1" if _flag(config, DEVICE_ALLOCATOR, p[DEVICE_ALLOCATOR]) else "0"
        )
    cuda: dict[str, str] = {}
    for key, choices in _CUDA_CHOICES.items():
        if key in p:
            cuda[key] = _choice(config, key, p[key], choices)
    if "gpu_mem_limit" in p:
        cuda["gpu_mem_limit"] = str(_count(config, "gpu_mem_limit", p["gpu_mem_limit"]))
    if "share_session_between_instances" in p:
        _flag(config, "share_session_between_instances", p["share_session_between_instances"])
    arena = _flag(config, "enable_mem_arena", p["enable_mem_arena"]) if "enable_mem_arena" in p else None
    shrinkage = _shrinkage(config, p[SHRINKAGE]) if SHRINKAGE in p else ()
    if arena is False and any(e.startswith("cpu:") for e in shrinkage):
        # ONNX Runtime would fail every run: there is no CPU arena to shrink
        raise ConfigError(
            f"{_where(config, SHRINKAGE)} names cpu:0, but enable_mem_arena is off, so there is no CPU arena "
            "to shrink"
        )
    return OnnxSessionOptions(
        graph_optimization_level=graph_level,
        intra_op_num_threads=_count(config, "intra_op_thread_count", p.get("intra_op_thread_count", "0")),
        inter_op_num_threads=_count(config, "inter_op_thread_count", p.get("inter_op_thread_count", "0")),
        execution_mode=_choice(config, "execution_mode", p.get("execution_mode", "0"), _EXECUTION_MODES),
        enable_cpu_mem_arena=arena,
        enable_mem_pattern=(
            _flag(config, "enable_mem_pattern", p["enable_mem_pattern"])
            if "enable_mem_pattern" in p
            else None
        ),
        session_config=frozen_map(session_config),
        arena_shrinkage=shrinkage,
        cuda_provider_options=frozen_map(cuda),
    )
