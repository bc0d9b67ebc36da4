"""Which config features zinfer implements: the one place to edit when behaviour is added.

``FEATURES`` lists every optional feature of the config surface with a test for "is it set to a
non-default value"; ``SUPPORTED_FEATURES`` names the ones zinfer implements. ``unsupported_features``
reports the features a config sets that are not supported, in ``FEATURES`` order. To add support for a
feature, add its name to ``SUPPORTED_FEATURES``.

Always supported, and so not listed: ``name``, ``platform``, ``backend``, ``max_batch_size`` and the
``name``/``data_type``/``dims`` of inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .optimization import Optimization
from .scheduling import QueuePolicy
from .tensors import InputFormat

if TYPE_CHECKING:
    from .model_config import ModelConfig

__all__ = ["FEATURES", "SUPPORTED_FEATURES", "unsupported_features"]

SUPPORTED_FEATURES: frozenset[str] = frozenset(
    {
        "version_policy",
        "input.reshape",
        "input.format",
        "input.optional",
        "model_warmup",
        "output.reshape",
        "output.label_filename",
        "dynamic_batching",
        "dynamic_batching.preferred_batch_size",
        "dynamic_batching.max_queue_delay_microseconds",
        "dynamic_batching.zinfer_latency_target_microseconds",
        "dynamic_batching.preserve_ordering",
        "model_transaction_policy.decoupled",
        "dynamic_batching.priority_levels",
        "dynamic_batching.default_queue_policy",
        "dynamic_batching.priority_queue_policy",
        "instance_group",
        "instance_group.name",
        "instance_group.kind",
        "instance_group.count",
        "instance_group.gpus",
        "instance_group.rate_limiter",
        "parameters",
        "metric_tags",
        "response_cache.enable",
        "sequence_batching",
        "sequence_batching.direct",
        "sequence_batching.oldest",
        "sequence_batching.max_sequence_idle_microseconds",
        "sequence_batching.control_input",
        "ensemble_scheduling",
        "sequence_batching.state",
    }
)


def _optimization_set(c: ModelConfig) -> bool:
    """``optimization`` beyond its defaults; an ONNX model's ``graph { level }`` (and its
    ``execution_accelerators``, refused by name in ``onnx_options``) are the onnxruntime backend's."""
    opt = c.optimization
    if c.platform == "onnxruntime_onnx" or c.backend == "onnxruntime":
        opt = replace(opt, graph_level=None, execution_accelerators=None)
    return opt != Optimization()


FEATURES: tuple[tuple[str, Callable[[ModelConfig], bool]], ...] = (
    ("version_policy", lambda c: c.version_policy.kind != "latest" or c.version_policy.num_versions != 1),
    ("runtime", lambda c: bool(c.runtime)),
    # the python and onnxruntime backends read their model file by this name; the built-in kernels have none
    (
        "default_model_filename",
        lambda c: (
            bool(c.default_model_filename)
            and c.backend not in ("python", "onnxruntime")
            and c.platform != "onnxruntime_onnx"
        ),
    ),
    ("cc_model_filenames", lambda c: bool(c.cc_model_filenames)),
    ("input.reshape", lambda c: any(t.reshape is not None for t in c.input)),
    ("input.format", lambda c: any(t.format is not InputFormat.FORMAT_NONE for t in c.input)),
    ("input.is_shape_tensor", lambda c: any(t.is_shape_tensor for t in c.input)),
    ("input.allow_ragged_batch", lambda c: any(t.allow_ragged_batch for t in c.input)),
    ("input.optional", lambda c: any(t.optional for t in c.input)),
    ("input.is_non_linear_format_io", lambda c: any(t.is_non_linear_format_io for t in c.input)),
    ("output.reshape", lambda c: any(t.reshape is not None for t in c.output)),
    ("output.label_filename", lambda c: any(t.label_filename for t in c.output)),
    ("output.is_shape_tensor", lambda c: any(t.is_shape_tensor for t in c.output)),
    ("output.is_non_linear_format_io", lambda c: any(t.is_non_linear_format_io for t in c.output)),
    ("batch_input", lambda c: bool(c.batch_input)),
    ("batch_output", lambda c: bool(c.batch_output)),
    ("optimization", lambda c: _optimization_set(c)),
    ("dynamic_batching", lambda c: c.dynamic_batching is not None),
    (
        "dynamic_batching.preferred_batch_size",
        lambda c: c.dynamic_batching is not None and bool(c.dynamic_batching.preferred_batch_size),
    ),
    (
        "dynamic_batching.max_queue_delay_microseconds",
        lambda c: c.dynamic_batching is not None and c.dynamic_batching.max_queue_delay_microseconds > 0,
    ),
    (
        "dynamic_batching.zinfer_latency_target_microseconds",
        lambda c: (
            c.dynamic_batching is not None and c.dynamic_batching.zinfer_latency_target_microseconds > 0
        ),
    ),
    (
        "dynamic_batching.preserve_ordering",
        lambda c: c.dynamic_batching is not None and c.dynamic_batching.preserve_ordering,
    ),
    (
        "dynamic_batching.priority_levels",
        lambda c: c.dynamic_batching is not None and c.dynamic_batching.priority_levels > 0,
    ),
    (
        "dynamic_batching.default_queue_policy",
        lambda c: (
            c.dynamic_batching is not None
            and c.dynamic_batching.default_queue_policy not in (None, QueuePolicy())
        ),
    ),
    (
        "dynamic_batching.priority_queue_policy",
        lambda c: c.dynamic_batching is not None and bool(c.dynamic_batching.priority_queue_policy),
    ),
    ("sequence_batching", lambda c: c.sequence_batching is not None),
    (
        "sequence_batching.direct",
        lambda c: c.sequence_batching is not None and c.sequence_batching.direct is not None,
    ),
    (
        "sequence_batching.oldest",
        lambda c: c.sequence_batching is not None and c.sequence_batching.oldest is not None,
    ),
    (
        "sequence_batching.oldest.preserve_ordering",
        lambda c: (
            c.sequence_batching is not None
            and c.sequence_batching.oldest is not None
            and c.sequence_batching.oldest.preserve_ordering
        ),
    ),
    (
        "sequence_batching.max_sequence_idle_microseconds",
        lambda c: (
            c.sequence_batching is not None
            and c.sequence_batching.max_sequence_idle_microseconds != 1_000_000
        ),
    ),
    (
        "sequence_batching.control_input",
        lambda c: c.sequence_batching is not None and bool(c.sequence_batching.control_input),
    ),
    (
        "sequence_batching.state",
        lambda c: c.sequence_batching is not None and bool(c.sequence_batching.state),
    ),
    (
        "sequence_batching.iterative_sequence",
        lambda c: c.sequence_batching is not None and c.sequence_batching.iterative_sequence,
    ),
    ("ensemble_scheduling", lambda c: c.ensemble_scheduling is not None),
    ("instance_group", lambda c: bool(c.instance_group)),
    ("instance_group.name", lambda c: bool(c.instance_group)),
    ("instance_group.kind", lambda c: bool(c.instance_group)),
    ("instance_group.count", lambda c: any(g.count != 1 for g in c.instance_group)),
    ("instance_group.gpus", lambda c: any(g.gpus for g in c.instance_group)),
    ("instance_group.rate_limiter", lambda c: any(g.rate_limiter is not None for g in c.instance_group)),
    ("instance_group.secondary_devices", lambda c: any(g.secondary_devices for g in c.instance_group)),
    ("instance_group.profile", lambda c: any(g.profile for g in c.instance_group)),
    ("instance_group.passive", lambda c: any(g.passive for g in c.instance_group)),
    ("instance_group.host_policy", lambda c: any(g.host_policy for g in c.instance_group)),
    ("parameters", lambda c: bool(c.parameters)),
    ("metric_tags", lambda c: bool(c.metric_tags)),
    ("model_warmup", lambda c: bool(c.model_warmup)),
    (
        "model_operations",
        lambda c: c.model_operations is not None and bool(c.model_operations.op_library_filename),
    ),
    ("model_transaction_policy.decoupled", lambda c: c.model_transaction_policy.decoupled),
    ("model_repository_agents", lambda c: bool(c.model_repository_agents)),
    ("response_cache.enable", lambda c: c.response_cache.enable),
    ("model_metrics", lambda c: c.model_metrics is not None and bool(c.model_metrics.metric_control)),
)


def unsupported_features(config: ModelConfig) -> list[str]:
    """The names of the features ``config`` sets that zinfer does not implement yet."""
    return [name for name, is_set in FEATURES if name not in SUPPORTED_FEATURES and is_set(config)]
