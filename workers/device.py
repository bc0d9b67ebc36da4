"""Where a worker's model runs: the host (NumPy) or one GPU (CuPy), behind one small interface.

``open_device("cpu")`` gives :class:`CpuDevice`; ``open_device("gpu:N")`` imports CuPy (only then) and
gives ``zinfer.workers.gpu.GpuDevice`` bound to device N with one CUDA stream of its own. The batch
runner moves tensors through the device: ``batch`` builds a batch array from the requests' host arrays
(a concatenation on the host, H2D copies into one device buffer on a GPU), ``copy_to_host`` writes an
output piece into a request's slot and ``synchronize`` waits for those copies before the reply goes.
``pin``/``unpin`` page-lock a client region while it is mapped, so its copies are real DMA.

A GPU device can also overlap the next batch's host-to-device copies with the current batch's compute
(``zinfer.workers.gpu`` says what overlaps when): ``stage`` starts a coming batch's copies, ``take_staged``
lets ``batch`` use them, and ``on_wait`` is the worker's hook that ``synchronize`` runs before it blocks.
:func:`prefetch_wanted` says whether a worker looks ahead at all (model parameter ``gpu_prefetch``). On the
CPU all three do nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zinfer.client import dtypes
from zinfer.client.errors import ConfigError
from zinfer.client.shm import Segment

from .device_wait import WaitHook
from .model import AnyModel, Array, RequestModel

if TYPE_CHECKING:
    from zinfer.modelconfig.model_config import ModelConfig

log = logging.getLogger(__name__)


PREFETCH_PARAMETER = "gpu_prefetch"
_SWITCH = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
           "off": False, "": False}  # fmt: skip


class Device(Protocol):
    spec: str  # "cpu" or "gpu:<id>"
    kind: str  # "CPU" or "GPU" (Triton's model_instance_kind)
    id: int  # the GPU's index; 0 for the CPU
    is_host: bool  # arrays are NumPy arrays in host memory
    xp: ModuleType  # numpy or cupy
    on_wait: WaitHook | None  # run by ``synchronize`` before it blocks; never run on the CPU

    def module_of(self, a: Any) -> ModuleType:
        """``cupy`` for a device array, ``numpy`` otherwise."""
        ...

    def upload(self, a: Array) -> Array:
        """A host array on this device (weights at load time)."""
        ...

    def batch(self, pieces: Sequence[Array]) -> Array:
        """One batch array from the requests' host arrays, along axis 0 (a lone piece may be kept)."""
        ...

    def as_output(self, value: Any) -> Array:
        """A model's output value as an array: device arrays as they are, anything else through NumPy."""
        ...

    def copy_to_host(self, a: Array, dst: Array) -> None:
        """Write ``a`` into the host array ``dst`` (same shape and dtype); done by ``synchronize``."""
        ...

    def to_host(self, a: Array) -> Array:
        """``a`` as a C-contiguous host array."""
        ...

    def stage(self, tag: object, inputs: Sequence[Sequence[Array]]) -> int:
        """Start copying a coming batch's inputs (one entry of pieces per input); the bytes copied."""
        ...

    def take_staged(self, tag: object) -> bool:
        """Batch ``tag`` starts: its staged copies (if any) serve ``batch``; others are dropped."""
        ...

    def synchronize(self) -> None: ...

    def pin(self, seg: Segment) -> None: ...

    def unpin(self, seg: Segment) -> None: ...

    def close(self) -> None: ...


class CpuDevice:
    spec = "cpu"
    kind = "CPU"
    id = 0
    is_host = True
    xp: ModuleType = np
    on_wait: WaitHook | None = None

    def module_of(self, a: Any) -> ModuleType:
        return np

    def upload(self, a: Array) -> Array:
        return a

    def batch(self, pieces: Sequence[Array]) -> Array:
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)

    def as_output(self, value: Any) -> Array:
        return np.asarray(value)

    def copy_to_host(self, a: Array, dst: Array) -> None:
        # else the model wrote it there. ``may_share_memory`` (a bounds test in C) first: ``ctypes.data``
        # builds a ctypes object per call, several µs, where the copy of a small output costs one
        if not np.may_share_memory(a, dst) or a.ctypes.data != dst.ctypes.data or a.strides != dst.strides:
            np.copyto(dst, a)

    def to_host(self, a: Array) -> Array:
        return np.ascontiguousarray(a)

    def stage(self, tag: object, inputs: Sequence[Sequence[Array]]) -> int:
        return 0

    def take_staged(self, tag: object) -> bool:
        return False

    def synchronize(self) -> None:
        pass

    def pin(self, seg: Segment) -> None:
        pass

    def unpin(self, seg: Segment) -> None:
        pass

    def close(self) -> None:
        pass


CPU = CpuDevice()


def parse_device(spec: str) -> int | None:
    """The GPU index of ``gpu:<N>``, None for ``cpu``; anything else is a :class:`ConfigError`."""
    if spec == "cpu":
        return None
    kind, _, index = spec.partition(":")
    if kind == "gpu" and index.isascii() and index.isdigit():
        return int(index)
    raise ConfigError(f"device {spec!r}: expected 'cpu' or 'gpu:<index>'")


def open_device(spec: str) -> Device:
    """The device a worker was started for (``--device``); a GPU that cannot be used is a ConfigError."""
    gpu = parse_device(spec)
    if gpu is None:
        return CPU
    from .gpu import GpuDevice

    return GpuDevice(gpu)


def prefetch_wanted(config: ModelConfig, model: AnyModel, device: Device) -> bool:
    """Whether this instance looks ahead: takes a second batch while one runs and stages its copies.

    The model parameter ``gpu_prefetch`` (``true``/``false``, default false) asks for it; it is honoured
    on a GPU for a whole-batch model (built-in kernels, native Python models) with an input that lives on
    the device, and not for request-by-request, decoupled, sequence or adaptive models. A bad value is a
    load error, on any device.
    """
    raw = config.parameters.get(PREFETCH_PARAMETER, "false")
    wanted = _SWITCH.get(raw.strip().lower())
    if wanted is None:
        raise ConfigError(
            f"model '{config.name}': parameter {PREFETCH_PARAMETER} must be true or false, got {raw!r}"
        )
    if not wanted or device.is_host:
        return False
    kinds = {dtypes.wire_to_numpy(dtypes.config_to_wire(t.data_type)).kind for t in config.input}
    reason = ""
    if isinstance(model, RequestModel):
        reason = "the model answers request by request"
    elif config.decoupled:
        reason = "the model is decoupled"
    elif config.sequence_batching is not None:
        reason = "the model uses sequence batching"
    elif config.dynamic_batching is not None and config.dynamic_batching.zinfer_latency_target_microseconds:
        reason = "adaptive batching times each batch from send to result"
    elif not kinds & set("biuf"):
        reason = "no input is copied to the device"
    if reason:
        log.info("event=gpu_prefetch_off model=%s reason=%r", config.name, reason)
        return False
    return True
