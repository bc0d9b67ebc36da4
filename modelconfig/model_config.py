"""Triton model configurations (``config.pbtxt``): strict loading into typed, frozen records.

``load_model_config(path, model_name)`` and ``parse_model_config(text, source=..., model_name=...)`` give
a :class:`ModelConfig`, or raise :class:`ConfigError` naming the file, line and field. Loading is strict:
an unknown field anywhere, a wrong value type, an unknown enum value or data type, a singular field
given twice, and two schedulers at once are all errors.

Triton's defaults and normalisation are applied, so readers never see unset fields:

* ``name`` absent -> the model's directory name (present and different -> error);
* ``version_policy`` absent -> ``latest { num_versions: 1 }``;
* ``dynamic_batching.preferred_batch_size`` empty -> ``[max_batch_size]`` when ``max_batch_size > 0``;
* ``sequence_batching.max_sequence_idle_microseconds`` 0 -> 1 000 000, strategy absent -> ``direct``;
* ``instance_group`` absent -> one ``KIND_AUTO`` group of count 1 named after the model; a group's
  ``count`` defaults to 1 and its ``name`` to ``<model>_<index>``;
* ``optimization.input_pinned_memory``/``output_pinned_memory`` absent -> enabled.

``unsupported_features`` (in ``zinfer.modelconfig.features``) says which fields are set that zinfer
does not implement yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zinfer.client.errors import ConfigError

from . import pbtxt
from .block import INT32, Block
from .ensemble import EnsembleScheduling, decode_ensemble_scheduling
from .features import SUPPORTED_FEATURES, unsupported_features
from .instances import InstanceGroup, InstanceKind, decode_instance_group
from .model_options import (
    ModelMetrics,
    ModelOperations,
    ModelWarmup,
    RepositoryAgent,
    ResponseCache,
    TransactionPolicy,
    decode_model_metrics,
    decode_model_operations,
    decode_repository_agents,
    decode_response_cache,
    decode_transaction_policy,
    decode_warmup,
)
from .optimization import Optimization, decode_optimization
from .record_base import empty_map, frozen_map, json_meta, record_to_dict
from .scheduling import DynamicBatching, decode_dynamic_batching
from .sequence_batching import SequenceBatching, decode_sequence_batching
from .tensors import (
    BatchInput,
    BatchOutput,
    InputConfig,
    OutputConfig,
    TensorConfig,
    decode_batch_input,
    decode_batch_output,
    decode_input,
    decode_output,
)
from .version_policy import VersionPolicy, decode_version_policy

__all__ = [
    "CONFIG_FILENAME",
    "SUPPORTED_FEATURES",
    "DynamicBatching",
    "InputConfig",
    "InstanceGroup",
    "InstanceKind",
    "ModelConfig",
    "OutputConfig",
    "TensorConfig",
    "VersionPolicy",
    "load_model_config",
    "parse_model_config",
    "unsupported_features",
]

CONFIG_FILENAME = "config.pbtxt"

_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model's configuration after Triton's defaults; see the module docstring."""

    name: str
    platform: str = ""
    backend: str = ""
    runtime: str = ""
    version_policy: VersionPolicy = VersionPolicy()
    max_batch_size: int = 0
    input: tuple[InputConfig, ...] = ()
    output: tuple[OutputConfig, ...] = ()
    batch_input: tuple[BatchInput, ...] = ()
    batch_output: tuple[BatchOutput, ...] = ()
    optimization: Optimization = Optimization()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    ensemble_scheduling: EnsembleScheduling | None = None
    instance_group: tuple[InstanceGroup, ...] = ()
    default_model_filename: str = ""
    cc_model_filenames: Mapping[str, str] = field(default_factory=empty_map)
    metric_tags: Mapping[str, str] = field(default_factory=empty_map)
    parameters: Mapping[str, str] = field(
        default_factory=empty_map, metadata=json_meta(wrap_values="string_value")
    )
    model_warmup: tuple[ModelWarmup, ...] = ()
    model_operations: ModelOperations | None = None
    model_transaction_policy: TransactionPolicy = TransactionPolicy()
    model_repository_agents: tuple[RepositoryAgent, ...] = field(
        default=(), metadata=json_meta(wrap="agents")
    )
    response_cache: ResponseCache = ResponseCache()
    model_metrics: ModelMetrics | None = None

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form, as the model_config reply carries it."""
        return record_to_dict(self)

    @property
    def decoupled(self) -> bool:
        return self.model_transaction_policy.decoupled

    def input_named(self, name: str) -> InputConfig | None:
        return next((tensor for tensor in self.input if tensor.name == name), None)

    def output_named(self, name: str) -> OutputConfig | None:
        return next((tensor for tensor in self.output if tensor.name == name), None)


def _unique_names(b: Block, blocks: list[Block], tensors: tuple[TensorConfig, ...], what: str) -> None:
    seen: set[str] = set()
    for block, tensor in zip(blocks, tensors, strict=True):
        if tensor.name in seen:
            raise block.error(f"{what} name '{tensor.name}' is used twice", "name")
        seen.add(tensor.name)


def _model_name(b: Block, model_name: str) -> str:
    name = b.string("name")
    if name and name != model_name:
        raise b.error(f"'{name}' must equal the model's directory name '{model_name}'", "name")
    return model_name


def _decode(b: Block, model_name: str) -> ModelConfig:
    name = _model_name(b, model_name)
    max_batch_size = b.integer("max_batch_size", INT32)
    if max_batch_size < 0:
        raise b.error(f"must be >= 0, got {max_batch_size}", "max_batch_size")
    policy = b.block("version_policy")
    input_blocks = b.blocks("input")
    output_blocks = b.blocks("output")
    inputs = tuple(decode_input(x) for x in input_blocks)
    outputs = tuple(decode_output(x) for x in output_blocks)
    _unique_names(b, input_blocks, inputs, "input")
    _unique_names(b, output_blocks, outputs, "output")

    scheduler = b.oneof(*_SCHEDULERS)
    dynamic = sequence = ensemble = None
    if scheduler == "dynamic_batching":
        dynamic = decode_dynamic_batching(_block(b, scheduler), max_batch_size)
    elif scheduler == "sequence_batching":
        sequence = decode_sequence_batching(_block(b, scheduler), max_batch_size)
    elif scheduler == "ensemble_scheduling":
        ensemble = decode_ensemble_scheduling(_block(b, scheduler))

    groups = tuple(decode_instance_group(g, i, name) for i, g in enumerate(b.blocks("instance_group")))
    if not groups:
        groups = (InstanceGroup(name=name),)
    optimization = b.block("optimization")
    operations = b.block("model_operations")
    agents = b.block("model_repository_agents")
    metrics = b.block("model_metrics")
    config = ModelConfig(
        name=name,
        platform=b.string("platform"),
        backend=b.string("backend"),
        runtime=b.string("runtime"),
        version_policy=VersionPolicy() if policy is None else decode_version_policy(policy),
        max_batch_size=max_batch_size,
        input=inputs,
        output=outputs,
        batch_input=tuple(decode_batch_input(x) for x in b.blocks("batch_input")),
        batch_output=tuple(decode_batch_output(x) for x in b.blocks("batch_output")),
        optimization=Optimization() if optimization is None else decode_optimization(optimization),
        dynamic_batching=dynamic,
        sequence_batching=sequence,
        ensemble_scheduling=ensemble,
        instance_group=groups,
        default_model_filename=b.string("default_model_filename"),
        cc_model_filenames=frozen_map(b.string_map("cc_model_filenames")),
        metric_tags=frozen_map(b.string_map("metric_tags")),
        parameters=frozen_map(b.map("parameters", str, _parameter_value)),
        model_warmup=tuple(decode_warmup(w, max_batch_size) for w in b.blocks("model_warmup")),
        model_operations=None if operations is None else decode_model_operations(operations),
        model_transaction_policy=decode_transaction_policy(b),
        model_repository_agents=() if agents is None else decode_repository_agents(agents),
        response_cache=decode_response_cache(b),
        model_metrics=None if metrics is None else decode_model_metrics(metrics),
    )
    b.finish()
    return config


def _block(b: Block, name: str) -> Block:
    block = b.block(name)
    if block is None:  # pragma: no cover - only called for fields that are present
        raise b.error("is required", name)
    return block


def _parameter_value(entry: Block, name: str) -> str:
    block = _block(entry, name)
    value = block.string("string_value")
    block.finish()
    return value


def parse_model_config(text: str, *, source: str, model_name: str) -> ModelConfig:
    """Parse the text of a ``config.pbtxt``; ``source`` names it in errors, ``model_name`` is its folder."""
    tree = pbtxt.parse(text, source)
    return _decode(Block(tree, source), model_name)


def load_model_config(path: Path, model_name: str) -> ModelConfig:
    """Read and parse ``path``; a file that cannot be read or decoded is a :class:`ConfigError` too."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_model_config(text, source=str(path), model_name=model_name)
