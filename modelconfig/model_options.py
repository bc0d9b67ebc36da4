"""The model's smaller top-level messages: warmup, transaction policy, response cache, metrics, operations,
repository agents.

``decode_transaction_policy`` and ``decode_response_cache`` take the model's block and give the default
record when their block is absent; the others take their own block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .block import INT64, UINT32, Block, nonnegative, optional_block, required_block, required_string
from .record_base import empty_map, frozen_map, json_meta

__all__ = [
    "MetricControl",
    "ModelMetrics",
    "ModelOperations",
    "ModelWarmup",
    "RepositoryAgent",
    "ResponseCache",
    "TransactionPolicy",
    "WarmupInput",
    "decode_model_metrics",
    "decode_model_operations",
    "decode_repository_agents",
    "decode_response_cache",
    "decode_transaction_policy",
    "decode_warmup",
]


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One warmup input: zeros, random data or the file ``input_data_file`` (exactly one)."""

    data_type: str
    dims: tuple[int, ...]
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims)}
        if self.input_data_file:
            out["input_data_file"] = self.input_data_file
        elif self.random_data:
            out["random_data"] = True
        else:
            out["zero_data"] = True
        return out


@dataclass(frozen=True, slots=True)
class ModelWarmup:
    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput] = field(default_factory=empty_map)
    count: int = 0


@dataclass(frozen=True, slots=True)
class MetricControl:
    """``metric_identifier { family }`` and ``histogram_options { buckets }``."""

    family: str = field(default="", metadata=json_meta("metric_identifier", wrap="family"))
    buckets: tuple[float, ...] | None = field(
        default=None, metadata=json_meta("histogram_options", wrap="buckets")
    )


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    metric_control: tuple[MetricControl, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelOperations:
    op_library_filename: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RepositoryAgent:
    name: str
    parameters: Mapping[str, str] = field(default_factory=empty_map)


@dataclass(frozen=True, slots=True)
class TransactionPolicy:
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class ResponseCache:
    enable: bool = False


def _warmup_input_value(entry: Block, name: str) -> WarmupInput:
    b = required_block(entry, name)
    source = b.oneof("zero_data", "random_data", "input_data_file")
    if source is None:
        raise b.error("needs one of zero_data, random_data, input_data_file")
    record = WarmupInput(
        data_type=b.data_type(),
        dims=b.integers("dims", INT64, nonnegative),
        zero_data=b.boolean("zero_data"),
        random_data=b.boolean("random_data"),
        input_data_file=b.string("input_data_file"),
    )
    if source == "input_data_file" and not record.input_data_file:
        raise b.error("may not be empty", "input_data_file")
    b.finish()
    return record


def decode_warmup(b: Block, max_batch_size: int) -> ModelWarmup:
    record = ModelWarmup(
        name=required_string(b, "name"),
        batch_size=b.integer("batch_size", UINT32),
        inputs=frozen_map(b.map("inputs", str, _warmup_input_value)),
        count=b.integer("count", UINT32),
    )
    limit = max(max_batch_size, 1)
    if not 1 <= record.batch_size <= limit:
        raise b.error(f"must be in [1, {limit}] (max_batch_size {max_batch_size})", "batch_size")
    b.finish()
    return record


def _decode_metric_control(b: Block) -> MetricControl:
    identifier = required_block(b, "metric_identifier")
    family = required_string(identifier, "family")
    identifier.finish()
    options = b.block("histogram_options")
    buckets: tuple[float, ...] | None = None
    if options is not None:
        buckets = options.reals("buckets")
        if list(buckets) != sorted(buckets):
            raise options.error("must be in ascending order", "buckets")
        options.finish()
    b.finish()
    return MetricControl(family=family, buckets=buckets)


def decode_model_metrics(b: Block) -> ModelMetrics:
    record = ModelMetrics(metric_control=tuple(_decode_metric_control(c) for c in b.blocks("metric_control")))
    b.finish()
    return record


def decode_model_operations(b: Block) -> ModelOperations:
    record = ModelOperations(op_library_filename=b.strings("op_library_filename"))
    b.finish()
    return record


def _decode_agent(b: Block) -> RepositoryAgent:
    record = RepositoryAgent(
        name=required_string(b, "name"), parameters=frozen_map(b.string_map("parameters"))
    )
    b.finish()
    return record


def decode_repository_agents(b: Block) -> tuple[RepositoryAgent, ...]:
    agents = tuple(_decode_agent(a) for a in b.blocks("agents"))
    b.finish()
    return agents


def decode_transaction_policy(b: Block) -> TransactionPolicy:
    return optional_block(
        b,
        "model_transaction_policy",
        lambda x: TransactionPolicy(decoupled=x.boolean("decoupled")),
        TransactionPolicy(),
    )


def decode_response_cache(b: Block) -> ResponseCache:
    return optional_block(
        b, "response_cache", lambda x: ResponseCache(enable=x.boolean("enable")), ResponseCache()
    )
