"""Built-in models that need no code: ``backend: "zinfer"`` with a ``kernel`` parameter.

- ``add``: ``OUTPUT0 = INPUT0 + INPUT1`` (by position; a second output, if configured, gets the difference);
- ``identity``: each output is the input at the same position;
- ``linear``: ``Y = X @ W + b`` from ``W.npy`` (and optionally ``b.npy``) in the version folder and an
  optional ``activation`` parameter (``relu``, ``gelu``, ``sigmoid``, ``tanh``; default none);
- ``mlp``: a stack of linear layers from ``weights.npz`` (``W0``, ``b0``, ``W1``, ``b1``, ...) with an
  ``activations`` parameter, one per layer (see ``zinfer.workers.dense``).

Every kernel runs on the instance's device: NumPy (BLAS) on CPU instances, CuPy (cuBLAS) on GPU ones.
On the CPU, kernels take an ``alloc(name, shape, dtype)`` callback: when the worker can offer the
request's own output slot in shared memory it returns an array there, and the kernel writes its result
straight into it, so no scatter copy follows. It returns None otherwise, and the kernel allocates as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig

from .dense import LinearKernel, MlpKernel
from .device import CPU, Device
from .kernel_base import Kernel
from .model import Alloc, Array, Model, no_alloc

__all__ = [
    "KERNELS",
    "AddKernel",
    "Alloc",
    "IdentityKernel",
    "LinearKernel",
    "MlpKernel",
    "Model",
    "load_kernel",
    "no_alloc",
]


class AddKernel(Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path | None, device: Device = CPU) -> None:
        super().__init__(config, device)
        if len(self.in_names) != 2 or not 1 <= len(self.out_names) <= 2:
            raise ConfigError(f"model {config.name!r}: kernel 'add' needs 2 inputs and 1 or 2 outputs")

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        a, b = inputs[self.in_names[0]], inputs[self.in_names[1]]  # (two: checked when built)
        shape = a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape)
        xp = np if self.device is CPU else self.device.module_of(a)  # no interpreted call on the host
        out = {}
        for name, dtype, op in zip(self.out_names, self.out_dtypes, (xp.add, xp.subtract), strict=False):
            # no slots offered (``no_alloc``, interpreted): nothing asked of it
            dst = None if alloc is no_alloc else alloc(name, shape, dtype)
            out[name] = op(a, b, dtype=dtype) if dst is None else op(a, b, out=dst, dtype=dtype)
        return out


class IdentityKernel(Kernel):
    def __init__(self, config: ModelConfig, version_dir: Path | None, device: Device = CPU) -> None:
        super().__init__(config, device)
        if len(self.in_names) != len(self.out_names):
            raise ConfigError(f"model {config.name!r}: kernel 'identity' needs as many outputs as inputs")

    def execute(self, inputs: Mapping[str, Array], alloc: Alloc = no_alloc) -> Mapping[str, Array]:
        # the inputs themselves, never a copy in an offered slot: the worker copies each into its output
        # slot (the one copy the slot cost before), or, where the client allows it, names the input's own
        # range as the output's (``batch_io.emit``), and no copy is made at all
        return {o: inputs[i] for i, o in zip(self.in_names, self.out_names, strict=True)}


KernelFactory = Callable[[ModelConfig, Path, Device], Model]

KERNELS: dict[str, KernelFactory] = {
    "add": AddKernel,
    "identity": IdentityKernel,
    "linear": LinearKernel,
    "mlp": MlpKernel,
}


def load_kernel(config: ModelConfig, version_dir: Path, device: Device = CPU) -> Model:
    """Build the built-in kernel a ``backend: "zinfer"`` model names."""
    kernel = config.parameters.get("kernel")
    if kernel not in KERNELS:
        raise ConfigError(
            f"model {config.name!r}: parameter 'kernel' must be one of {sorted(KERNELS)}, got {kernel!r}"
        )
    return KERNELS[kernel](config, version_dir, device)
