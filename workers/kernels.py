"""Built-in models that need no code: ``backend: "zinfer"`` with a ``kernel`` parameter.

- ``add``: ``OUTPUT0 = INPUT0 + INPUT1`` (by position; a second output, if configured, gets the difference);
- ``identity``: each output is the input at the same position;
- ``linear``: ``Y = X @ W + b`` with ``W.npy`` (and optionally ``b.npy``) in the version folder and an
  optional ``activation`` parameter (``relu``, ``gelu``, ``sigmoid``, ``tanh``; default none).

Kernels take an ``alloc(name, shape, dtype)`` callback: when the worker can offer the request's own output
slot in shared memory it returns an array there, and the kernel writes its result straight into it, so no
scatter copy follows. It returns None otherwise, and the kernel allocates as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from zinfer.broker.model_config import ModelConfig
from zinfer.client.dtypes import config_to_wire, wire_to_numpy
from zinfer.client.errors import ConfigError

Array = npt.NDArray[Any]
Alloc = Callable[[str, tuple[int, ...], np.dtype[Any]], Array | None]


def no_alloc(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array | None:
    return None


class Model(Protocol):
    """What a worker runs: the whole batch in, the whole batch out, by tensor name.

    A model whose ``writes_into_slots`` is true also takes an ``alloc`` callback (see the module text).
    """

    def execute(self, inputs: Mapping[str, Array], /) -> Mapping[str, Array]: ...

    def finalize(self) -> None: ...


class _Kernel:
    writes_into_slots = True

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.in_names = [t.name for t in config.input]
        self.out_names = [t.name for t in config.output]
        self.out_dtypes = [wire_to_numpy(config_to_wire(t.data_type)) for t in config.output]

    def finalize(self) -> None:
        pass


class AddKernel(_Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        if len(self.in_names) != 2 or not 1 <= len(self.out_names) <= 2:
            raise ConfigError(f"model {config.name!r}: kernel 'add' needs 2 inputs and 1 or 2 outputs")

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        a, b = (inputs[n] for n in self.in_names)
        shape = a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape)
        out = {}
        for name, dtype, op in zip(self.out_names, self.out_dtypes, (np.add, np.subtract), strict=False):
            dst = alloc(name, shape, dtype)
            out[name] = op(a, b, dtype=dtype) if dst is None else op(a, b, out=dst, dtype=dtype)
        return out


class IdentityKernel(_Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        if len(self.in_names) != len(self.out_names):
            raise ConfigError(f"model {config.name!r}: kernel 'identity' needs as many outputs as inputs")

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        out = {}
        for i, o in zip(self.in_names, self.out_names, strict=True):
            x = inputs[i]
            dst = alloc(o, x.shape, x.dtype)
            if dst is not None:
                np.copyto(dst, x)
            out[o] = x if dst is None else dst
        return out


def _gelu(x: Array) -> Array:
    inner = 0.7978845608028654 * (x + 0.044715 * x**3)
    return 0.5 * x * (1 + np.tanh(inner))  # type: ignore[no-any-return]


def _apply_activation(name: str, y: Array) -> Array:
    """Apply in place where NumPy allows (``y`` is the kernel's own buffer)."""
    if name == "relu":
        return np.maximum(y, 0, out=y)
    if name == "sigmoid":
        np.negative(y, out=y)
        np.exp(y, out=y)
        y += 1
        return np.reciprocal(y, out=y)
    if name == "tanh":
        return np.tanh(y, out=y)
    if name == "gelu":
        y[...] = _gelu(y)
    return y


ACTIVATIONS = ("none", "relu", "sigmoid", "tanh", "gelu")


class LinearKernel(_Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        if len(self.in_names) != 1 or len(self.out_names) != 1:
            raise ConfigError(f"model {config.name!r}: kernel 'linear' needs 1 input and 1 output")
        w_path = version_dir / "W.npy"
        if not w_path.is_file():
            raise ConfigError(f"model {config.name!r}: kernel 'linear' needs {w_path.name} in {version_dir}")
        self.dtype = self.out_dtypes[0]
        compute = np.float32 if self.dtype == np.float16 else self.dtype
        self.w = np.load(w_path, allow_pickle=False).astype(compute)
        b_path = version_dir / "b.npy"
        self.b = np.load(b_path, allow_pickle=False).astype(compute) if b_path.is_file() else None
        if self.w.ndim != 2 or (self.b is not None and self.b.shape != (self.w.shape[1],)):
            raise ConfigError(f"model {config.name!r}: W must be [in, out] and b [out]")
        self.activation = config.parameters.get("activation", "none")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"model {config.name!r}: unknown activation {self.activation!r}")

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        x = inputs[self.in_names[0]].astype(self.w.dtype, copy=False)
        if x.shape[-1] != self.w.shape[0]:
            raise ValueError(f"input has {x.shape[-1]} features, W expects {self.w.shape[0]}")
        shape = (*x.shape[:-1], self.w.shape[1])
        dst = alloc(self.out_names[0], shape, self.dtype) if self.w.dtype == self.dtype else None
        y = np.matmul(x, self.w) if dst is None else np.matmul(x, self.w, out=dst)
        if self.b is not None:
            y += self.b
        y = _apply_activation(self.activation, y)
        return {self.out_names[0]: y.astype(self.dtype, copy=False)}


KERNELS: dict[str, Callable[[ModelConfig, Path], Model]] = {
    "add": AddKernel,
    "identity": IdentityKernel,
    "linear": LinearKernel,
}


def load_model(config: ModelConfig, version_dir: Path) -> Model:
    """Build the model a worker runs from its config."""
    if config.backend != "zinfer":
        raise ConfigError(
            f'model {config.name!r}: backend {config.backend!r} is not supported yet (use backend: "zinfer")'
        )
    kernel = config.parameters.get("kernel")
    if kernel not in KERNELS:
        raise ConfigError(
            f"model {config.name!r}: parameter 'kernel' must be one of {sorted(KERNELS)}, got {kernel!r}"
        )
    return KERNELS[kernel](config, version_dir)
