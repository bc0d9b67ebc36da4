"""Triton's auto-complete for ONNX models: ``input``, ``output`` and ``max_batch_size`` from the graph.

A config with ``platform: "onnxruntime_onnx"`` or ``backend: "onnxruntime"`` may leave out its inputs,
its outputs and its ``max_batch_size``; they are filled in from the model file (``default_model_filename``,
else ``model.onnx``, in the version folder) as Triton's ONNX Runtime backend does:

* no ``input`` (no ``output``): every graph input (output) is listed, with the graph's data type and dims
  (a symbolic or unknown dim becomes -1); tensors the config lists are kept as they are;
* ``max_batch_size`` 0 and every graph input and output has a variable leading dim (and the tensors the
  config lists leave that dim out): batching is allowed, and ``max_batch_size`` becomes
  :data:`DEFAULT_MAX_BATCH_SIZE` (Triton's ``--backend-config=default-max-batch-size``, 4 by default);
  the filled-in dims then leave out that leading dim;
* ``max_batch_size`` > 1 and no scheduler: ``dynamic_batching`` is switched on, as in Triton; a
  ``dynamic_batching`` the config gives gets its ``preferred_batch_size`` normalised to the completed
  ``max_batch_size`` when it lists none. (A config that leaves out ``max_batch_size`` cannot list
  ``preferred_batch_size``: it is read, strictly, against a max_batch_size of 0.)

The broker (``repository.load_model_entry``) and the worker both complete the config the same way, so they
agree on the model's signature. The graph is read without loading the model (``onnx_graph``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from zinfer.client.errors import ConfigError

from .model_config import InputConfig, ModelConfig, OutputConfig, TensorConfig
from .onnx_graph import GraphTensor, OnnxGraph, read_onnx_graph
from .scheduling import DynamicBatching
from .sequence_batching import fed_by_batcher

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "ONNX_BACKEND",
    "ONNX_DEFAULT_FILENAME",
    "ONNX_PLATFORM",
    "complete_config",
    "complete_onnx_config",
    "is_onnx",
    "onnx_model_path",
]

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
ONNX_DEFAULT_FILENAME = "model.onnx"
DEFAULT_MAX_BATCH_SIZE = 4


def is_onnx(config: ModelConfig) -> bool:
    return config.platform == ONNX_PLATFORM or config.backend == ONNX_BACKEND


def onnx_model_path(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or ONNX_DEFAULT_FILENAME)


def _leading_dim_variable(t: GraphTensor) -> bool:
    return t.dims is not None and len(t.dims) >= 1 and t.dims[0] is None


def _listed_without_batch_dim(listed: tuple[TensorConfig, ...], graph: tuple[GraphTensor, ...]) -> bool:
    by_name = {t.name: t for t in graph}
    for tensor in listed:
        found = by_name.get(tensor.name)
        if found is None or found.dims is None or tensor.reshape is not None:
            continue
        if len(tensor.dims) != len(found.dims) - 1:
            return False
    return True


def _can_batch(config: ModelConfig, graph: OnnxGraph) -> bool:
    tensors = graph.inputs + graph.outputs
    return (
        bool(tensors)
        and all(_leading_dim_variable(t) for t in tensors)
        and _listed_without_batch_dim(config.input, graph.inputs)
        and _listed_without_batch_dim(config.output, graph.outputs)
    )


def _shape(
    config: ModelConfig, t: GraphTensor, batching: bool, what: str
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """The ``dims`` (and ``reshape``) a graph tensor gets in the completed config."""
    if not t.data_type:
        raise ConfigError(
            f"model {config.name!r}: cannot auto-complete {what} {t.name!r}: its ONNX type "
            f"{t.onnx_type} has no Triton data type; list the model's {what}s in config.pbtxt"
        )
    if t.dims is None:
        raise ConfigError(
            f"model {config.name!r}: cannot auto-complete {what} {t.name!r}: the graph gives no shape; "
            f"list the model's {what}s in config.pbtxt"
        )
    dims = tuple(-1 if d is None else d for d in (t.dims[1:] if batching else t.dims))
    if not dims:  # a scalar: Triton's shapes have rank >= 1, so [1] reshaped to []
        return (1,), ()
    return dims, None


def _input(config: ModelConfig, t: GraphTensor, batching: bool) -> InputConfig:
    dims, reshape = _shape(config, t, batching, "input")
    return InputConfig(name=t.name, data_type=t.data_type, dims=dims, reshape=reshape)


def _output(config: ModelConfig, t: GraphTensor, batching: bool) -> OutputConfig:
    dims, reshape = _shape(config, t, batching, "output")
    return OutputConfig(name=t.name, data_type=t.data_type, dims=dims, reshape=reshape)


def complete_onnx_config(config: ModelConfig, graph: OnnxGraph) -> ModelConfig:
    """``config`` with what it leaves out filled in from ``graph``; see the module docstring."""
    max_batch_size = config.max_batch_size
    if max_batch_size == 0 and _can_batch(config, graph):
        max_batch_size = DEFAULT_MAX_BATCH_SIZE
    batching = max_batch_size > 0
    fed, taken = fed_by_batcher(config.sequence_batching)  # the sequence batcher's, not the client's
    inputs = config.input or tuple(_input(config, t, batching) for t in graph.inputs if t.name not in fed)
    outputs = config.output or tuple(
        _output(config, t, batching) for t in graph.outputs if t.name not in taken
    )
    dynamic = config.dynamic_batching
    no_scheduler = dynamic is None and config.sequence_batching is None and config.ensemble_scheduling is None
    if max_batch_size > 1 and no_scheduler:
        dynamic = DynamicBatching(preferred_batch_size=(max_batch_size,))
    elif dynamic is not None and not dynamic.preferred_batch_size and max_batch_size > 0:
        # the config's dynamic_batching was read with max_batch_size 0: normalise it as for any model
        dynamic = replace(dynamic, preferred_batch_size=(max_batch_size,))
    return replace(
        config, max_batch_size=max_batch_size, input=inputs, output=outputs, dynamic_batching=dynamic
    )


def complete_config(config: ModelConfig, model_dir: Path, version: int) -> ModelConfig:
    """The config as served: an ONNX model's auto-completed from version ``version``'s model file, a python
    model's by its own ``auto_complete_config`` (``python_autocomplete``); any other config unchanged. An
    ONNX config that lists its inputs, outputs and a max_batch_size > 0 is returned without reading the
    model file (the worker checks it against the graph at load)."""
    if config.backend == "python":
        from .python_autocomplete import complete_python_config  # subprocess and resource: only here

        return complete_python_config(config, model_dir / str(version))
    if not is_onnx(config):
        return config
    if config.input and config.output and config.max_batch_size > 0:
        return config
    path = onnx_model_path(config, model_dir / str(version))
    if not path.is_file():
        raise ConfigError(f"model {config.name!r}: backend 'onnxruntime' needs {path}: not found")
    return complete_onnx_config(config, read_onnx_graph(path))
