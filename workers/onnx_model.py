"""ONNX models through ONNX Runtime: ``platform: "onnxruntime_onnx"`` or ``backend: "onnxruntime"``.

The version folder's ``default_model_filename`` (``model.onnx`` when unset) is loaded into an
``onnxruntime.InferenceSession`` (the optional extra ``zinfer[onnx]``). The model is a :class:`Model`:
it gets the whole batch the dynamic batcher formed, as one array per input, and runs it in one
``session.run``. At load the config's tensors are checked against the graph (the config as completed by
``zinfer.modelconfig.autocomplete``): every graph input listed, every listed tensor in the graph with the
same data type and a shape the graph accepts; a mismatch fails the load with a ConfigError naming the
tensor.

``TYPE_STRING`` tensors: zinfer's BYTES tensors are NumPy object arrays of ``bytes``; ONNX Runtime's Python
API takes string tensors as object arrays of ``str`` only (it turns a ``bytes`` element into its repr,
``"b'...'"``), and hands them back as ``str``. So string inputs are decoded as UTF-8 before ``session.run``
(an element that is not UTF-8 fails the batch with InvalidArgument naming the input) and string outputs go
back as UTF-8.

Session options come from the config as Triton's onnxruntime backend reads them
(``zinfer.modelconfig.onnx_options``: ``optimization { graph { level } }``, ``intra_op_thread_count``,
``inter_op_thread_count``, ``execution_mode``, ``enable_mem_arena``, ``enable_mem_pattern``, session and run
config entries, CUDA provider options on KIND_GPU).

Instances: KIND_CPU runs on ONNX Runtime's CPU execution provider. KIND_GPU needs ``onnxruntime-gpu``
with the CUDA execution provider and is refused at load without it; with it, the session runs on the
instance's GPU (the CUDA device number inside the worker's process) with the instance's compute stream as
its ``user_compute_stream``, and reads and writes the worker's device buffers through I/O binding
(``zinfer.workers.onnx_binding``): the batch's inputs are bound where the worker copied them, the outputs
stay on the device until the batch runner copies each request's piece into its reply slot. A model with
``TYPE_STRING`` inputs, which ONNX Runtime cannot bind, runs through the host instead (inputs copied to the
host, ``session.run``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.client.errors import ConfigError, InvalidArgument
from zinfer.modelconfig.autocomplete import onnx_model_path
from zinfer.modelconfig.model_config import ModelConfig, TensorConfig
from zinfer.modelconfig.onnx_graph import ONNX_TO_CONFIG
from zinfer.modelconfig.onnx_options import OnnxSessionOptions, onnx_session_options
from zinfer.modelconfig.sequence_batching import fed_by_batcher

from .device import Device
from .model import Array
from .onnx_binding import DEVICE_TYPES, BoundRun, cupy_place

log = logging.getLogger(__name__)

# ONNX Runtime's type strings -> ONNX TensorProto.DataType numbers
_ORT_TYPES: dict[str, int] = {
    "tensor(float)": 1,
    "tensor(uint8)": 2,
    "tensor(int8)": 3,
    "tensor(uint16)": 4,
    "tensor(int16)": 5,
    "tensor(int32)": 6,
    "tensor(int64)": 7,
    "tensor(string)": 8,
    "tensor(bool)": 9,
    "tensor(float16)": 10,
    "tensor(double)": 11,
    "tensor(uint32)": 12,
    "tensor(uint64)": 13,
    "tensor(bfloat16)": 16,
}


def _import_onnxruntime(name: str) -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            f"model {name!r}: backend 'onnxruntime' needs the onnxruntime package: "
            "pip install 'zinfer[onnx]' (or onnxruntime-gpu for KIND_GPU instances)"
        ) from None
    return onnxruntime


def _model_shape(tensor: TensorConfig, max_batch_size: int) -> tuple[int, ...]:
    """The shape the model sees for ``tensor``: ``reshape`` when set, with the batch dim when batching."""
    dims = tensor.reshape if tensor.reshape is not None else tensor.dims
    return (-1, *dims) if max_batch_size > 0 else dims


def _check_tensor(config: ModelConfig, tensor: TensorConfig, node: Any, what: str) -> None:
    where = f"model {config.name!r}: {what} {tensor.name!r}"
    graph_type = ONNX_TO_CONFIG.get(_ORT_TYPES.get(node.type, 0), node.type)
    if graph_type != tensor.data_type:
        raise ConfigError(f"{where} is {tensor.data_type} in config.pbtxt but {graph_type} in the graph")
    graph_shape = node.shape
    if graph_shape is None:  # the graph does not say
        return
    shape = _model_shape(tensor, config.max_batch_size)
    graph_dims = [d if isinstance(d, int) and d >= 0 else None for d in graph_shape]
    shown = [-1 if d is None else d for d in graph_dims]
    if len(shape) != len(graph_dims):
        batch = " (with the batch dim max_batch_size > 0 adds)" if config.max_batch_size > 0 else ""
        raise ConfigError(
            f"{where} has shape {list(shape)}{batch} in config.pbtxt but rank {len(graph_dims)} "
            f"({shown}) in the graph"
        )
    for i, (dim, graph_dim) in enumerate(zip(shape, graph_dims, strict=True)):
        if graph_dim is not None and dim != graph_dim:
            if i == 0 and config.max_batch_size > 0:
                raise ConfigError(
                    f"{where}: the graph fixes the leading dim to {graph_dim}, so the model cannot take "
                    "a batch; set max_batch_size: 0 and give the full shape in dims"
                )
            raise ConfigError(f"{where} has shape {list(shape)} in config.pbtxt but {shown} in the graph")


def check_signature(config: ModelConfig, session: Any) -> None:
    """The config's inputs and outputs against the session's graph; a ConfigError on any mismatch."""
    graph_inputs = {node.name: node for node in session.get_inputs()}
    graph_outputs = {node.name: node for node in session.get_outputs()}
    for tensor in config.input:
        node = graph_inputs.get(tensor.name)
        if node is None:
            raise ConfigError(
                f"model {config.name!r}: input {tensor.name!r} is not an input of the graph "
                f"(the graph's inputs: {', '.join(sorted(graph_inputs)) or 'none'})"
            )
        _check_tensor(config, tensor, node, "input")
    fed, _ = fed_by_batcher(config.sequence_batching)  # control and state inputs: the sequence batcher's
    missing = sorted(set(graph_inputs) - {t.name for t in config.input} - fed)
    if missing:
        raise ConfigError(
            f"model {config.name!r}: the graph needs input(s) {', '.join(missing)}, "
            "which config.pbtxt does not list"
        )
    for out in config.output:
        node = graph_outputs.get(out.name)
        if node is None:
            raise ConfigError(
                f"model {config.name!r}: output {out.name!r} is not an output of the graph "
                f"(the graph's outputs: {', '.join(sorted(graph_outputs)) or 'none'})"
            )
        _check_tensor(config, out, node, "output")


def _providers(ort: Any, config: ModelConfig, device: Device, options: OnnxSessionOptions) -> list[Any]:
    if device.kind != "GPU":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ConfigError(
            f"model {config.name!r}: a KIND_GPU instance of an onnxruntime model needs onnxruntime-gpu "
            f"with the CUDA execution provider; this onnxruntime has {', '.join(available)} "
            "(install onnxruntime-gpu, or use instance_group { kind: KIND_CPU })"
        )
    cuda = {"device_id": str(gpu_ordinal(device)), **options.cuda_provider_options}
    stream = getattr(device, "stream", None)
    if stream is not None:  # its kernels on the instance's compute stream, ordered with the copies
        cuda["has_user_compute_stream"] = "1"
        cuda["user_compute_stream"] = str(int(stream.ptr))
    return [("CUDAExecutionProvider", cuda)]


def gpu_ordinal(device: Device) -> int:
    """The CUDA device number of ``device`` inside this process (not the server's GPU index)."""
    return int(getattr(device, "ordinal", device.id))


def session_options(ort: Any, options: OnnxSessionOptions) -> Any:
    """``onnxruntime.SessionOptions`` with what the config sets."""
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: its warnings would go to the worker's stderr
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, options.graph_optimization_level)
    so.execution_mode = getattr(ort.ExecutionMode, options.execution_mode)
    so.intra_op_num_threads = options.intra_op_num_threads
    so.inter_op_num_threads = options.inter_op_num_threads
    if options.enable_cpu_mem_arena is not None:
        so.enable_cpu_mem_arena = options.enable_cpu_mem_arena
    if options.enable_mem_pattern is not None:
        so.enable_mem_pattern = options.enable_mem_pattern
    for key, value in options.session_config.items():
        so.add_session_config_entry(key, value)
    return so


def run_options(ort: Any, options: OnnxSessionOptions, device: Device) -> Any:
    """``onnxruntime.RunOptions`` for every ``session.run``, or None when the config sets none."""
    shrinkage = options.shrinkage_for(on_gpu=not device.is_host)
    if not shrinkage:
        return None
    ro = ort.RunOptions()
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
    return ro


def _as_text(name: str, array: Any) -> Any:
    """A BYTES input (an object array of ``bytes``) as ONNX Runtime takes string tensors: ``str``."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, (bytes, bytearray, memoryview)):
            try:
                out[i] = bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidArgument(
                    f"input {name!r}: element {i} of the batch is not UTF-8 text ({exc.reason} at byte "
                    f"{exc.start}); ONNX Runtime takes string tensors as text, so an onnxruntime model's "
                    "TYPE_STRING inputs must be UTF-8"
                ) from None
        else:
            out[i] = str(item)
    return out.reshape(array.shape)


class OnnxModel:
    """An ONNX Runtime session behind the :class:`Model` interface: the whole batch in one run."""

    def __init__(self, session: Any, config: ModelConfig, device: Device, run_opts: Any = None) -> None:
        self.session = session
        self.run_options = run_opts
        self.device = device
        # the config's outputs, and the implicit state outputs the sequence batcher keeps for the next request
        _, states = fed_by_batcher(config.sequence_batching)
        self.outputs = [t.name for t in config.output] + sorted(states - {t.name for t in config.output})
        self.string_inputs = frozenset(t.name for t in config.input if t.data_type == "TYPE_STRING")
        self.bound: BoundRun | None = None
        if not device.is_host and not self.string_inputs:  # ONNX Runtime cannot bind string inputs
            device_outputs = frozenset(t.name for t in config.output if t.data_type in DEVICE_TYPES)
            place = cupy_place(device.xp, gpu_ordinal(device))
            self.bound = BoundRun(session, self.outputs, device_outputs, place, run_opts)

    def execute(self, inputs: Mapping[str, Array], /) -> Mapping[str, Array]:
        """The batch runner has applied ``reshape`` already (and undoes it on the outputs)."""
        if self.bound is not None:
            return self.bound.run(inputs)
        if self.device.is_host:
            feed: Mapping[str, Any] = inputs
        else:  # a GPU instance of a model with string inputs: through the host
            feed = {name: self.device.to_host(array) for name, array in inputs.items()}
        if self.string_inputs:
            feed = {n: _as_text(n, a) if n in self.string_inputs else a for n, a in feed.items()}
        results = self.session.run(self.outputs, feed, self.run_options)
        return dict(zip(self.outputs, results, strict=True))

    def finalize(self) -> None:
        self.session = None
        self.bound = None


def load_onnx_model(config: ModelConfig, version_dir: Path, device: Device) -> OnnxModel:
    ort = _import_onnxruntime(config.name)
    path = onnx_model_path(config, version_dir)
    if not path.is_file():
        raise ConfigError(f"model {config.name!r}: backend 'onnxruntime' needs {path}: not found")
    options = onnx_session_options(config)
    providers = _providers(ort, config, device, options)
    try:
        session = ort.InferenceSession(
            str(path), sess_options=session_options(ort, options), providers=providers
        )
    except Exception as exc:
        raise ConfigError(f"{path}: ONNX Runtime cannot load it: {type(exc).__name__}: {exc}") from None
    check_signature(config, session)
    log.info(
        "event=onnx_loaded model=%s file=%s providers=%s", config.name, path.name, session.get_providers()
    )
    return OnnxModel(session, config, device, run_options(ort, options, device))
