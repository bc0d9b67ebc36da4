"""``ensemble_scheduling``: the steps of an ensemble and how their tensors map onto the ensemble's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .block import INT64, UINT32, Block, required_string
from .record_base import empty_map, frozen_map

__all__ = [
    "EnsembleScheduling",
    "EnsembleStep",
    "decode_ensemble_scheduling",
]


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """``model_version`` -1 (also when absent) means the latest version."""

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=empty_map)
    output_map: Mapping[str, str] = field(default_factory=empty_map)
    model_namespace: str = ""


@dataclass(frozen=True, slots=True)
class EnsembleScheduling:
    step: tuple[EnsembleStep, ...] = ()
    max_inflight_requests: int = 0
    max_inflight_responses: int = 0


def _decode_step(b: Block) -> EnsembleStep:
    record = EnsembleStep(
        model_name=required_string(b, "model_name"),
        model_version=b.integer("model_version", INT64, default=-1),
        input_map=frozen_map(b.string_map("input_map")),
        output_map=frozen_map(b.string_map("output_map")),
        model_namespace=b.string("model_namespace"),
    )
    if record.model_version < -1:
        raise b.error("must be -1 (latest) or a version >= 0", "model_version")
    b.finish()
    return record


def decode_ensemble_scheduling(b: Block) -> EnsembleScheduling:
    record = EnsembleScheduling(
        step=tuple(_decode_step(s) for s in b.blocks("step")),
        max_inflight_requests=b.integer("max_inflight_requests", UINT32),
        max_inflight_responses=b.integer("max_inflight_responses", UINT32),
    )
    if not record.step:
        raise b.error("an ensemble needs at least one step", "step")
    b.finish()
    return record
