"""Dense built-in kernels: ``linear`` (one layer) and ``mlp`` (a stack of layers).

A layer is ``h = activation(h @ W + b)`` with ``W`` of shape ``[in, out]`` and an optional ``b`` of shape
``[out]``. Weights are read once at load, cast to the compute type and placed on the instance's device:
GEMMs go through cuBLAS (``cupy.matmul``) on GPU instances and NumPy's BLAS on CPU ones. FP16 models
compute in FP16 on a GPU (tensor cores) and in FP32 on the CPU (NumPy has no FP16 GEMM), and return FP16.

Weights:

- ``linear``: ``W.npy`` and optionally ``b.npy`` in the version folder, or the file a ``weights``
  parameter names there: an ``.npz`` with ``W`` and ``b`` (or ``W0`` and ``b0``), or an ``.npy`` with W.
  Parameter ``activation``: one of ``none`` (default), ``relu``, ``gelu``, ``sigmoid``, ``tanh``.
- ``mlp``: ``weights.npz`` (or the ``.npz`` a ``weights`` parameter names) with ``W0, b0, W1, b1, ...``,
  or the files ``W0.npy, b0.npy, W1.npy, ...`` in the version folder; each ``b<i>`` is optional.
  Parameter ``activations``: one per layer, comma-separated, e.g. ``"relu,relu,none"`` (default: relu
  after every layer but the last).

Every problem with the weights (a missing or unreadable file, shapes that do not chain, or that do not
match the config's dims) fails the load with an error naming the file.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig

from .device import CPU, Device
from .kernel_base import Kernel
from .model import Alloc, Array, no_alloc

ACTIVATIONS = ("none", "relu", "sigmoid", "tanh", "gelu")


def _gelu(x: Any, xp: ModuleType) -> Any:
    inner = 0.7978845608028654 * (x + 0.044715 * x**3)
    return 0.5 * x * (1 + xp.tanh(inner))


def apply_activation(name: str, y: Any, xp: ModuleType = np) -> Any:
    """Apply in place where the array module allows (``y`` is the kernel's own buffer)."""
    if name == "relu":
        return xp.maximum(y, 0, out=y)
    if name == "sigmoid":
        xp.negative(y, out=y)
        xp.exp(y, out=y)
        y += 1
        return xp.reciprocal(y, out=y)
    if name == "tanh":
        return xp.tanh(y, out=y)
    if name == "gelu":
        y[...] = _gelu(y, xp)
    return y


class Layer(NamedTuple):
    w: Array
    b: Array | None
    activation: str


def load_arrays(path: Path) -> dict[str, Array]:
    """The arrays of an ``.npz`` (by name) or an ``.npy`` (as ``W``); never unpickles."""
    try:
        loaded: Any = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"{path}: weights file not found") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})") from None
    if isinstance(loaded, np.ndarray):
        return {"W": loaded}
    with loaded:
        try:
            return {key: loaded[key] for key in loaded.files}
        except (OSError, ValueError, zipfile.BadZipFile) as bad:
            raise ConfigError(f"{path}: cannot read weights ({type(bad).__name__}: {bad})") from None


def _npy_files(version_dir: Path, count_from: int | None) -> dict[str, Array]:
    """``W.npy``/``b.npy`` (``count_from`` None) or ``W0.npy``, ``b0.npy``, ``W1.npy``, ... as arrays."""
    out: dict[str, Array] = {}
    if count_from is None:
        names = ["W", "b"]
    else:
        names = []
        i = count_from
        while (version_dir / f"W{i}.npy").is_file():
            names += [f"W{i}", f"b{i}"]
            i += 1
    for name in names:
        path = version_dir / f"{name}.npy"
        if path.is_file():
            out[name] = load_arrays(path)["W"]
    return out


def _activation(model: str, value: str, source: str) -> str:
    name = value.strip().lower()
    if name not in ACTIVATIONS:
        raise ConfigError(
            f"model {model!r}: unknown activation {value.strip()!r} in parameter {source!r} "
            f"(one of {', '.join(ACTIVATIONS)})"
        )
    return name


def linear_layers(config: ModelConfig, version_dir: Path) -> tuple[list[Layer], Path]:
    activation = _activation(config.name, config.parameters.get("activation", "none"), "activation")
    weights = config.parameters.get("weights")
    if weights:
        source = version_dir / weights
        arrays = load_arrays(source)
        w = arrays.get("W", arrays.get("W0"))
        b = arrays.get("b", arrays.get("b0"))
    else:
        source = version_dir / "W.npy"
        if not source.is_file():
            raise ConfigError(f"model {config.name!r}: kernel 'linear' needs weights: {source} not found")
        arrays = _npy_files(version_dir, None)
        w, b = arrays.get("W"), arrays.get("b")
    if w is None:
        raise ConfigError(f"{source}: has no array named W")
    return [Layer(w, b, activation)], source


def mlp_layers(config: ModelConfig, version_dir: Path) -> tuple[list[Layer], Path]:
    source = version_dir / config.parameters.get("weights", "weights.npz")
    if source.is_file():
        arrays = load_arrays(source)
    elif (version_dir / "W0.npy").is_file():
        source = version_dir / "W0.npy"
        arrays = _npy_files(version_dir, 0)
    else:
        raise ConfigError(
            f"model {config.name!r}: kernel 'mlp' needs weights: {source} not found "
            f"(an .npz with W0, b0, W1, b1, ...; or W0.npy, b0.npy, ... in {version_dir})"
        )
    count = 0
    while f"W{count}" in arrays:
        count += 1
    expected = {f"W{i}" for i in range(count)} | {f"b{i}" for i in range(count)}
    unexpected = sorted(set(arrays) - expected)
    if count == 0 or unexpected:
        found = ", ".join(sorted(arrays)) or "nothing"
        raise ConfigError(f"{source}: expected arrays W0, b0, W1, b1, ... (consecutive), found {found}")
    given = config.parameters.get("activations")
    if given is None:
        names = ["relu"] * (count - 1) + ["none"]
    else:
        names = [_activation(config.name, a, "activations") for a in given.split(",")]
        if len(names) != count:
            raise ConfigError(
                f"model {config.name!r}: parameter 'activations' lists {len(names)} activations, "
                f"{source} has {count} layers"
            )
    layers = [Layer(arrays[f"W{i}"], arrays.get(f"b{i}"), names[i]) for i in range(count)]
    return layers, source


class DenseKernel(Kernel):
    kernel = "dense"

    def __init__(self, config: ModelConfig, device: Device, layers: list[Layer], source: Path) -> None:
        super().__init__(config, device)
        where = f"model {config.name!r}: kernel '{self.kernel}'"
        if len(self.in_names) != 1 or len(self.out_names) != 1:
            raise ConfigError(f"{where} needs 1 input and 1 output")
        self.dtype = self.out_dtypes[0]
        if self.dtype.kind != "f":
            raise ConfigError(f"{where} needs a floating-point output (TYPE_FP16, TYPE_FP32 or TYPE_FP64)")
        fp16_on_host = self.dtype == np.float16 and device.is_host
        self.compute = np.dtype(np.float32) if fp16_on_host else self.dtype
        _check_shapes(where, source, layers, config)
        self.layers = [
            Layer(
                device.upload(np.ascontiguousarray(layer.w, dtype=self.compute)),
                None if layer.b is None else device.upload(layer.b.astype(self.compute)),
                layer.activation,
            )
            for layer in layers
        ]
        self.features = int(layers[0].w.shape[0])

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        x = inputs[self.in_names[0]]
        if x.shape[-1] != self.features:
            raise ValueError(f"input has {x.shape[-1]} features, W expects {self.features}")
        xp = self.device.module_of(x)
        h = x.astype(self.compute, copy=False)
        if xp is np and not self.device.is_host:  # an input CuPy cannot hold (BF16): cast, then upload
            h = self.device.upload(np.ascontiguousarray(h))
            xp = self.device.xp
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            dst = None
            if i == last and self.compute == self.dtype:
                dst = alloc(self.out_names[0], (*h.shape[:-1], layer.w.shape[1]), self.dtype)
            h = xp.matmul(h, layer.w) if dst is None else np.matmul(h, layer.w, out=dst)
            if layer.b is not None:
                h += layer.b
            h = apply_activation(layer.activation, h, xp)
        return {self.out_names[0]: h.astype(self.dtype, copy=False)}


def _check_shapes(where: str, source: Path, layers: list[Layer], config: ModelConfig) -> None:
    prev: int | None = None
    for i, layer in enumerate(layers):
        w, b = layer.w, layer.b
        suffix = "" if len(layers) == 1 else str(i)
        if w.ndim != 2 or w.dtype.kind not in "fiu":
            got = f"{w.dtype}{list(w.shape)}"
            raise ConfigError(f"{source}: W{suffix} must be a 2-D numeric array [in, out], got {got}")
        if b is not None and b.shape != (w.shape[1],):
            raise ConfigError(f"{source}: b{suffix} must be [{w.shape[1]}], got {list(b.shape)}")
        if prev is not None and w.shape[0] != prev:
            raise ConfigError(f"{source}: W{suffix} takes {w.shape[0]} features, the last layer gave {prev}")
        prev = int(w.shape[1])
    dims_in, dims_out = config.input[0].dims, config.output[0].dims
    first_in, last_out = int(layers[0].w.shape[0]), int(layers[-1].w.shape[1])
    if not dims_in or (dims_in[-1] > 0 and dims_in[-1] != first_in):
        rows = f"the rows of W in {source}"
        raise ConfigError(f"{where}: input dims {list(dims_in)} must end in {first_in} ({rows})")
    if not dims_out or (dims_out[-1] > 0 and dims_out[-1] != last_out):
        last = f"the columns of the last W in {source}"
        raise ConfigError(f"{where}: output dims {list(dims_out)} must end in {last_out} ({last})")


class LinearKernel(DenseKernel):
    kernel = "linear"

    def __init__(self, config: ModelConfig, version_dir: Path, device: Device = CPU) -> None:
        layers, source = linear_layers(config, version_dir)
        super().__init__(config, device, layers, source)


class MlpKernel(DenseKernel):
    kernel = "mlp"

    def __init__(self, config: ModelConfig, version_dir: Path, device: Device = CPU) -> None:
        layers, source = mlp_layers(config, version_dir)
        super().__init__(config, device, layers, source)
