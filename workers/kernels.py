"""Built-in models that need no code: ``backend: "zinfer"`` with a ``kernel`` parameter.

- ``add``: ``OUTPUT0 = INPUT0 + INPUT1`` (by position; a second output, if configured, gets the difference);
- ``identity``: each output is the input at the same position;
- ``linear``: ``Y = X @ W + b`` with ``W.npy`` (and optionally ``b.npy``) in the version folder and an
  optional ``activation`` parameter (``relu``, ``gelu``, ``sigmoid``, ``tanh``; default none).
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

Array = npt.NDArray[np.generic]


class Model(Protocol):
    """What a worker runs: the whole batch in, the whole batch out, by tensor name."""

    def execute(self, inputs: Mapping[str, Array]) -> Mapping[str, Array]: ...

    def finalize(self) -> None: ...


class _Kernel:
    def __init__(self, config: ModelConfig) -> None:
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

    def execute(self, inputs: Mapping[str, Array]) -> Mapping[str, Array]:
        a, b = (np.asarray(inputs[n]) for n in self.in_names)
        out = {self.out_names[0]: np.add(a, b, dtype=self.out_dtypes[0])}
        if len(self.out_names) == 2:
            out[self.out_names[1]] = np.subtract(a, b, dtype=self.out_dtypes[1])
        return out


class IdentityKernel(_Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path) -> None:
        super().__init__(config)
        if len(self.in_names) != len(self.out_names):
            raise ConfigError(f"model {config.name!r}: kernel 'identity' needs as many outputs as inputs")

    def execute(self, inputs: Mapping[str, Array]) -> Mapping[str, Array]:
        return {o: inputs[i] for i, o in zip(self.in_names, self.out_names, strict=True)}


FloatArray = npt.NDArray[np.floating[Any]]

_ACTIVATIONS: dict[str, Callable[[FloatArray], FloatArray]] = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
}


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
        name = config.parameters.get("activation", "none")
        if name not in _ACTIVATIONS:
            raise ConfigError(f"model {config.name!r}: unknown activation {name!r}")
        self.act = _ACTIVATIONS[name]

    def execute(self, inputs: Mapping[str, Array]) -> Mapping[str, Array]:
        x = np.asarray(inputs[self.in_names[0]]).astype(self.w.dtype, copy=False)
        if x.shape[-1] != self.w.shape[0]:
            raise ValueError(f"input has {x.shape[-1]} features, W expects {self.w.shape[0]}")
        y = x @ self.w
        if self.b is not None:
            y += self.b
        return {self.out_names[0]: self.act(y).astype(self.dtype, copy=False)}


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
