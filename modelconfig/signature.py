"""A model's tensors as the hot paths need them: wire types, dtypes and dims looked up once per model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zinfer.client import dtypes

from .model_config import ModelConfig


@dataclass(frozen=True)
class TensorSpec:
    name: str
    config_type: str  # TYPE_FP32, ...
    wire: str  # FP32, ...
    dtype: np.dtype[Any]  # object for BYTES
    itemsize: int  # 0 for BYTES
    dims: tuple[int, ...]  # without the batch dimension
    reshape: tuple[int, ...] | None = None  # the shape the model sees instead of dims (config "reshape")
    optional: bool = False  # an input a request may leave out (config "optional")


@dataclass(frozen=True)
class Signature:
    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    decoupled: bool = False  # several responses per request (model_transaction_policy)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def of(cls, config: ModelConfig) -> Signature:
        def spec(t: Any) -> TensorSpec:
            wire = dtypes.config_to_wire(t.data_type)
            reshape = tuple(t.reshape) if t.reshape is not None else None
            return TensorSpec(t.name, t.data_type, wire, dtypes.wire_to_numpy(wire), dtypes.itemsize(wire),
                              tuple(t.dims), reshape, bool(getattr(t, "optional", False)))  # fmt: skip

        return cls(
            config.name,
            config.max_batch_size,
            {t.name: spec(t) for t in config.input},
            {t.name: spec(t) for t in config.output},
            config.decoupled,
        )
