"""The records of the dynamic batcher: its policy, a queued request, a formed batch and why it was sent.

Pure data, no I/O. :class:`BatchPolicy` carries Triton's ``dynamic_batching`` knobs (triton-features.md
§1.2) plus zinfer's adaptive latency target; :meth:`BatchPolicy.from_config` builds it from a
:class:`~zinfer.modelconfig.model_config.ModelConfig`. Exceptions a caller reports to the client::

    ValueError
    ├── QueueFull        the request's priority level holds max_queue_size requests already
    ├── InvalidPriority  the request's priority is outside [0, priority_levels]
    └── BatchTooLarge    the request's input bytes alone pass max_batch_bytes
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from zinfer.modelconfig.parameters import early_dispatch
from zinfer.modelconfig.record_base import empty_map, frozen_map
from zinfer.modelconfig.scheduling import QueuePolicy

if TYPE_CHECKING:
    from zinfer.modelconfig.model_config import ModelConfig

__all__ = [
    "Batch",
    "BatchPolicy",
    "BatchReason",
    "BatchTooLarge",
    "InvalidPriority",
    "QueueFull",
    "QueuePolicy",
    "QueuedRequest",
]

class QueueFull(ValueError):
    """The request's priority level already holds ``max_queue_size`` requests (Triton: UNAVAILABLE)."""


class InvalidPriority(ValueError):
    """The request's priority is not 0 (the default level) or a level in ``[1, priority_levels]``."""


class BatchTooLarge(ValueError):
    """The request's input bytes alone pass ``max_batch_bytes``: no batch could hold it."""


class BatchReason(enum.Enum):
    """Why a batch was sent (kept for explainability and metrics)."""

    NO_BATCHING = "no_batching"  # max_batch_size == 0: every request alone
    PREFERRED = "preferred"  # a preferred batch size was reached
    MAX_SIZE = "max_size"  # the next request would pass the size limit, or the batch is full
    MAX_BYTES = "max_bytes"  # the next request would pass the byte limit (max_batch_bytes)
    SHAPE_CUT = "shape_cut"  # the next request's variable dims differ
    DELAY_EXPIRED = "delay_expired"  # the oldest request waited max_queue_delay
    IDLE_NO_DELAY = "idle_no_delay"  # max_queue_delay is 0: an instance was free, send what is queued
    EARLY_NO_COMPANION = "early_no_companion"  # early dispatch: no other request is due within the delay
    ADAPTIVE_TARGET = "adaptive_target"  # adaptive: waiting longer would break the latency target
    ADAPTIVE_NO_GAIN = "adaptive_no_gain"  # adaptive: waiting for more requests would not pay


def _require_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def _check_queue_policy(name: str, policy: object) -> None:
    if not isinstance(policy, QueuePolicy):
        raise ValueError(f"{name} must be a QueuePolicy, got {policy!r}")
    _require_count(f"{name}.default_timeout_microseconds", policy.default_timeout_microseconds)
    _require_count(f"{name}.max_queue_size", policy.max_queue_size)


# Compiled with mypyc (``zinfer.broker.compiled``), but an ordinary class: a native one would turn a bool
# into an int, and refuse a str with a TypeError, before ``__post_init__`` could say what is wrong. Its
# checks read each field as it was given (``_given``): a typed read of an int field would do the same.
# Built once per model load; the batcher reads it once.
@mypyc_attr(native_class=False)
@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Batching knobs, named as in Triton's model config (``*_us`` for ``*_microseconds``).

    ``preferred_batch_sizes`` is normalised to a sorted, de-duplicated tuple; when empty and batching
    is on it becomes ``(max_batch_size,)`` as Triton does. ``priority_levels == 0`` means one queue
    under ``default_queue_policy``; otherwise ``default_priority_level`` must be in
    ``[1, priority_levels]`` and a level without an entry in ``priority_queue_policy`` uses
    ``default_queue_policy``. ``latency_target_us > 0`` switches on the adaptive mode
    (:mod:`zinfer.broker.batching.adaptive`), which then ignores ``max_queue_delay_us``; ``instances`` is the
    number of model instances, which the adaptive mode uses to estimate utilisation.
    ``max_batch_bytes > 0`` bounds the input bytes of one batch (the server's ``--max-batch-bytes``): a
    batch closes before the request that would pass it, and a request passing it alone is refused.
    ``early_dispatch`` sends a batch before ``max_queue_delay_us`` when no companion is due within it
    (:mod:`zinfer.broker.batching.early_dispatch`); off here, on for a model config with a queue delay (and
    no latency target) unless its parameter ``zinfer_early_dispatch`` is ``"false"``.
    """

    max_batch_size: int  # 0 = no batching
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=empty_map)
    latency_target_us: int = 0  # zinfer_latency_target_microseconds; 0 = off
    instances: int = 1
    max_batch_bytes: int = 0  # input bytes of one batch; 0 = no limit
    early_dispatch: bool = False  # max_queue_delay as an upper bound (``early_dispatch``); configs: on

    def __post_init__(self) -> None:
        max_size = _require_count("max_batch_size", self._given("max_batch_size"))
        _require_count("max_batch_bytes", self._given("max_batch_bytes"))
        _require_count("max_queue_delay_us", self._given("max_queue_delay_us"))
        _require_count("latency_target_us", self._given("latency_target_us"))
        flag = self._given("early_dispatch")
        if not isinstance(flag, bool):
            raise ValueError(f"early_dispatch must be a bool, got {flag!r}")
        if (instances := _require_count("instances", self._given("instances"))) < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        raw = self._given("preferred_batch_sizes")
        if not isinstance(raw, (tuple, list)):
            raise ValueError(f"preferred_batch_sizes must be a tuple of ints, got {raw!r}")
        sizes = {_require_count("preferred_batch_sizes entry", s) for s in raw}
        if max_size == 0 and sizes:
            raise ValueError(
                f"preferred_batch_sizes must be empty when max_batch_size is 0 (no batching), got {raw!r}"
            )
        bad = sorted(s for s in sizes if not 1 <= s <= max_size)
        if bad:
            raise ValueError(f"preferred_batch_sizes {bad} outside [1, max_batch_size={max_size}]")
        if not sizes and max_size > 0:
            sizes = {max_size}
        object.__setattr__(self, "preferred_batch_sizes", tuple(sorted(sizes)))
        self._check_priorities()

    def _given(self, name: str) -> object:
        """The field as it was given, unchecked (see the comment above the class)."""
        value: object = getattr(self, name)
        return value

    def _check_priorities(self) -> None:
        levels = _require_count("priority_levels", self._given("priority_levels"))
        default = _require_count("default_priority_level", self._given("default_priority_level"))
        if levels > 0 and not 1 <= default <= levels:
            raise ValueError(
                f"default_priority_level must be in [1, priority_levels={levels}], got {default}"
            )
        if levels == 0 and default != 0:
            raise ValueError(f"default_priority_level must be 0 without priority levels, got {default}")
        _check_queue_policy("default_queue_policy", self._given("default_queue_policy"))
        per_level = self._given("priority_queue_policy")
        if not isinstance(per_level, Mapping):
            raise ValueError(f"priority_queue_policy must be a mapping, got {per_level!r}")
        for level, policy in per_level.items():
            if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= levels:
                raise ValueError(
                    f"priority_queue_policy level {level!r} is not in [1, priority_levels={levels}]"
                )
            _check_queue_policy(f"priority_queue_policy[{level}]", policy)
        object.__setattr__(self, "priority_queue_policy", frozen_map(per_level))

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of ``level`` (1-based); 0 or a level without its own policy: the default."""
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    @classmethod
    def from_config(
        cls, config: ModelConfig, instances: int | None = None, max_batch_bytes: int = 0
    ) -> BatchPolicy:
        """The policy of a model config; ``instances`` defaults to the sum of its instance group counts;
        ``max_batch_bytes`` is the server's limit on one batch's input bytes (0: none).

        Without ``dynamic_batching`` a batching model gets Triton's default scheduler: every request is
        executed on its own (preferred size 1, no delay), and no priorities or queue policies apply.
        """
        count = instances if instances is not None else sum(g.count for g in config.instance_group) or 1
        db = config.dynamic_batching
        if db is None:
            preferred = (1,) if config.max_batch_size > 0 else ()
            return cls(config.max_batch_size, preferred, instances=count, max_batch_bytes=max_batch_bytes)
        return cls(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=tuple(db.preferred_batch_size),
            max_queue_delay_us=db.max_queue_delay_microseconds,
            priority_levels=db.priority_levels,
            default_priority_level=db.default_priority_level,
            default_queue_policy=db.default_queue_policy or QueuePolicy(),
            priority_queue_policy=db.priority_queue_policy,
            latency_target_us=db.zinfer_latency_target_microseconds,
            instances=count,
            max_batch_bytes=max_batch_bytes,
            early_dispatch=early_dispatch(config)  # where a batch would wait the delay at all
            and config.max_batch_size > 0
            and db.max_queue_delay_microseconds > 0
            and not db.zinfer_latency_target_microseconds,
        )


# QueuedRequest and Batch are built for every request and batch: native classes under mypyc, each with its
# own __init__ (a dataclass's generated one runs as interpreted code, ~20x slower for a frozen one). A
# native class's field would turn a bool into an int and refuse a float with a TypeError, so __init__ takes
# the fields a caller may get wrong as ``object`` and raises what ``DynamicBatcher.add`` has always raised.
@dataclass(frozen=True, slots=True, init=False)
class QueuedRequest:
    """One queued request; ``item`` is opaque to the batcher.

    ``priority`` is the request's own level (0 = the model's default level, 1 = highest) and
    ``timeout_us`` its own queue timeout (0 = none; used only where the queue policy allows an override,
    and only when shorter than the policy's default). A ``batch_size``, ``priority`` or ``timeout_us`` that
    is not an int (a bool is not) raises ValueError (:class:`InvalidPriority` for the priority) here; their
    ranges are checked as the request is queued, against the policy.
    """

    item: Any
    batch_size: int  # rows this request carries; a request with its own batch of N counts N
    shape_key: Hashable  # requests with different keys never share a batch
    arrival: float  # seconds on the caller's monotonic clock
    priority: int = 0
    timeout_us: int = 0
    nbytes: int = 0  # input bytes, counted against max_batch_bytes

    def __init__(
        self,
        item: Any,
        batch_size: object,
        shape_key: Hashable,
        arrival: float,
        priority: object = 0,
        timeout_us: object = 0,
        nbytes: int = 0,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise ValueError(f"request batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidPriority(f"priority must be an int, got {priority!r}")
        if isinstance(timeout_us, bool) or not isinstance(timeout_us, int):
            raise ValueError(f"request timeout_us must be an int >= 0, got {timeout_us!r}")
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "shape_key", shape_key)
        object.__setattr__(self, "arrival", arrival)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "timeout_us", timeout_us)
        object.__setattr__(self, "nbytes", nbytes)


@dataclass(frozen=True, slots=True, init=False)
class Batch:
    """A batch to hand to one free instance, items in service order (priority, then FIFO)."""

    items: tuple[Any, ...]
    size: int  # sum of the requests' batch_size
    reason: BatchReason

    def __init__(self, items: tuple[Any, ...], size: int, reason: BatchReason) -> None:
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "reason", reason)
