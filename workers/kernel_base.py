"""The base of the built-in kernels: tensor names and output dtypes from the config, and the device."""

from __future__ import annotations

from zinfer.client.dtypes import config_to_wire, wire_to_numpy
from zinfer.modelconfig.model_config import ModelConfig

from .device import CPU, Device


class Kernel:
    """A built-in kernel. It writes into a lone request's output slots only on the host."""

    def __init__(self, config: ModelConfig, device: Device = CPU) -> None:
        self.name = config.name
        self.device = device
        self.writes_into_slots = device.is_host
        self.in_names = [t.name for t in config.input]
        self.out_names = [t.name for t in config.output]
        self.out_dtypes = [wire_to_numpy(config_to_wire(t.data_type)) for t in config.output]

    def finalize(self) -> None:
        pass
