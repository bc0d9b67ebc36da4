"""``dynamic_batching`` and its queue policies (``default_queue_policy``, ``priority_queue_policy``).

The other schedulers are ``zinfer.modelconfig.sequence_batching`` and ``zinfer.modelconfig.ensemble``;
``zinfer.modelconfig.model_config`` allows one of the three. :func:`preferred_sizes` is shared with the
``oldest`` sequence strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .block import INT32, UINT32, UINT64, Block, required_block
from .record_base import ProtoEnum, empty_map, frozen_map, record_to_dict

__all__ = [
    "DynamicBatching",
    "QueuePolicy",
    "TimeoutAction",
    "decode_dynamic_batching",
    "decode_queue_policy",
    "preferred_sizes",
]


class TimeoutAction(ProtoEnum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """``preferred_batch_size`` is already normalised: ``(max_batch_size,)`` when it was empty.

    ``zinfer_latency_target_microseconds`` is zinfer's own field (not in Triton's proto): when > 0 the
    batcher adapts its waiting to meet that queue+execution latency target
    (``zinfer.broker.batching.adaptive``).
    """

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=empty_map)
    zinfer_latency_target_microseconds: int = 0  # zinfer's adaptive batching target; 0 = off

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form; the zinfer field only when it is set, so the rest stays Triton's."""
        out = record_to_dict(self)
        if not self.zinfer_latency_target_microseconds:
            del out["zinfer_latency_target_microseconds"]
        return out


def preferred_sizes(b: Block, max_batch_size: int) -> tuple[int, ...]:
    """``preferred_batch_size``, each in [1, max_batch_size]; empty becomes ``(max_batch_size,)``."""

    def check(size: int) -> str | None:
        if max_batch_size <= 0:
            return "a model with max_batch_size 0 takes no preferred batch size"
        if not 1 <= size <= max_batch_size:
            return f"{size} is not in [1, max_batch_size={max_batch_size}]"
        return None

    sizes = b.integers("preferred_batch_size", INT32, check)
    return sizes if sizes or max_batch_size <= 0 else (max_batch_size,)


def decode_queue_policy(b: Block) -> QueuePolicy:
    policy = QueuePolicy(
        timeout_action=b.enum("timeout_action", TimeoutAction, TimeoutAction.REJECT),
        default_timeout_microseconds=b.integer("default_timeout_microseconds", UINT64),
        allow_timeout_override=b.boolean("allow_timeout_override"),
        max_queue_size=b.integer("max_queue_size", UINT32),
    )
    b.finish()
    return policy


def _queue_policy_value(entry: Block, name: str) -> QueuePolicy:
    return decode_queue_policy(required_block(entry, name))


def decode_dynamic_batching(b: Block, max_batch_size: int) -> DynamicBatching:
    default_block = b.block("default_queue_policy")
    record = DynamicBatching(
        preferred_batch_size=preferred_sizes(b, max_batch_size),
        max_queue_delay_microseconds=b.integer("max_queue_delay_microseconds", UINT64),
        preserve_ordering=b.boolean("preserve_ordering"),
        priority_levels=b.integer("priority_levels", UINT64),
        default_priority_level=b.integer("default_priority_level", UINT64),
        default_queue_policy=None if default_block is None else decode_queue_policy(default_block),
        priority_queue_policy=frozen_map(b.map("priority_queue_policy", int, _queue_policy_value)),
        zinfer_latency_target_microseconds=b.integer("zinfer_latency_target_microseconds", UINT64),
    )
    levels = record.priority_levels
    if levels > 0 and not 1 <= record.default_priority_level <= levels:
        raise b.error(
            f"must be in [1, priority_levels={levels}], got {record.default_priority_level}",
            "default_priority_level",
        )
    if levels == 0 and record.default_priority_level != 0:
        raise b.error("needs priority_levels > 0", "default_priority_level")
    for level in record.priority_queue_policy:
        if not 1 <= level <= levels:
            raise b.error(
                f"priority level {level} is not in [1, priority_levels={levels}]", "priority_queue_policy"
            )
    b.finish()
    return record
