"""What the broker knows about one loaded model version: its scheduler (its kind picked here, once, at load:
``scheduler_for``), its instances and its statistics."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zinfer.client.protocol import Frame, Reply
from zinfer.modelconfig.instances import InstanceGroup
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.parameters import execution_limit_ns
from zinfer.modelconfig.signature import Signature

from .batching.batch_policy import BatchPolicy
from .batching.ordering import ResponseOrder
from .ensemble_plan import EnsemblePlan
from .latency_window import LatencyWindow, log_bin
from .metrics import ModelMetrics
from .pending import Pending
from .scheduler import Batching, EnsembleSteps, Runs, Scheduler, TakingTurns
from .sequence_scheduler import Sequences

__all__ = [
    "Duration", "InFlight", "LatencyBins", "ModelState", "ModelStats", "Pending", "instance_groups",
    "scheduler_for",
]  # fmt: skip


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


LATENCY_RESOLUTION = 1.05  # each latency bin is 5% wider than the one before, from 1 us
_INV_LOG_R = 1.0 / math.log(LATENCY_RESOLUTION)


@dataclass
class LatencyBins:
    """A cumulative histogram of request latencies in log-spaced bins: a quantile of any span is exact to
    one bin (5%), from the difference of two snapshots (``statistics``: ``latency_us``)."""

    counts: dict[int, int] = field(default_factory=dict)

    def add(self, ns: int) -> None:
        i = log_bin(ns / 1000, _INV_LOG_R)
        self.counts[i] = self.counts.get(i, 0) + 1

    def to_list(self) -> list[list[float]]:
        """``[[upper bound in us, count], ...]`` for the bins that hold any, ascending."""
        return [[round(LATENCY_RESOLUTION**i, 3), n] for i, n in sorted(self.counts.items())]


@dataclass
class ModelStats:
    """Cumulative figures in the shape of Triton's statistics extension."""

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)  # lookups that answered: the lookup time
    cache_miss: Duration = field(default_factory=Duration)  # lookups that did not: lookup + insert time
    batch_sizes: dict[int, int] = field(default_factory=dict)
    batch_reasons: dict[str, int] = field(default_factory=dict)
    latency: LatencyBins = field(default_factory=LatencyBins)  # of successful requests, arrival to reply

    def record_success(self, ns: int) -> None:
        self.success.add(ns)
        self.latency.add(ns)

    def record_batch(self, size: int, reason: str) -> None:
        self.execution_count += 1
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        self.batch_reasons[reason] = self.batch_reasons.get(reason, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "last_inference": self.last_inference_ms,
            "inference_stats": {
                "success": self.success.to_dict(),
                "fail": self.fail.to_dict(),
                "queue": self.queue.to_dict(),
                "compute_input": self.compute_input.to_dict(),
                "compute_infer": self.compute_infer.to_dict(),
                "compute_output": self.compute_output.to_dict(),
                "cache_hit": self.cache_hit.to_dict(),
                "cache_miss": self.cache_miss.to_dict(),
            },
            "batch_stats": [
                {"batch_size": size, "count": count} for size, count in sorted(self.batch_sizes.items())
            ],
            "batch_reasons": dict(sorted(self.batch_reasons.items())),
            "latency_us": self.latency.to_list(),
        }


@dataclass(init=False)
class InFlight:
    """A batch sent to a worker. (Its own ``__init__``: built per batch, and under mypyc a dataclass's
    generated one runs as interpreted code.)"""

    batch_id: int
    worker: bytes
    model: ModelState
    requests: list[Pending]
    sent_ns: int
    executions: int = 1  # a run (``batching.runs``): each request its own execution

    def __init__(
        self,
        batch_id: int,
        worker: bytes,
        model: ModelState,
        requests: list[Pending],
        sent_ns: int,
        executions: int = 1,
    ) -> None:
        self.batch_id = batch_id
        self.worker = worker
        self.model = model
        self.requests = requests
        self.sent_ns = sent_ns
        self.executions = executions


def instance_groups(config: ModelConfig, instances: int) -> list[InstanceGroup | None]:
    """The instance group of each instance index, in the order ``registry.place_instances`` places them:
    group by group, ``count`` per group on the CPU, ``count`` per listed GPU for a group that lists GPUs.
    Groups that list none take ``count`` per usable GPU (or ``count`` on the CPU for KIND_AUTO without
    GPUs); how many that is follows from ``instances``, the number placed in all. None past the end."""
    fixed: list[int | None] = []
    for g in config.instance_group:
        if g.kind in ("KIND_CPU", "KIND_MODEL"):
            fixed.append(g.count)
        elif g.gpus:
            fixed.append(g.count * len(g.gpus))
        else:
            fixed.append(None)
    open_counts = sum(g.count for g, n in zip(config.instance_group, fixed, strict=True) if n is None)
    rest = instances - sum(n for n in fixed if n is not None)
    per = rest // open_counts if open_counts and rest > 0 else 0
    out: list[InstanceGroup | None] = []
    for g, n in zip(config.instance_group, fixed, strict=True):
        out.extend([g] * (n if n is not None else g.count * per))
    out.extend([None] * (instances - len(out)))
    return out[:instances]


class ModelState:
    """One loaded model version: its config, its scheduler (picked once, here: ``scheduler.scheduler_for``),
    its instances and places (changed by ``instance_pool`` alone), its statistics and its readiness."""

    def __init__(
        self,
        config: ModelConfig,
        version: int,
        version_dir: Path,
        instances: int,
        max_batch_bytes: int = 0,
        plan: EnsemblePlan | None = None,
    ) -> None:
        self.config = config
        self.signature = Signature.of(config)
        self.name = config.name
        self.version = version
        self.version_dir = version_dir
        self.expected_instances = instances
        self.instances: set[bytes] = set()
        self.idle: deque[bytes] = deque()
        # the longest a batch may run on an instance (parameter execution_timeout_ms); None: no limit
        self.execution_limit_ns = execution_limit_ns(config)
        # how its requests wait and leave: one kind per model (an ensemble's ``plan``: its steps)
        self.scheduler: Scheduler = scheduler_for(
            config, self.instances, instances, max_batch_bytes, plan,
            pipelining=self.execution_limit_ns is None and not self.signature.decoupled,
            one_row=self.signature.batching,
        )  # fmt: skip
        db = config.dynamic_batching
        # with preserve_ordering, responses leave in arrival order: (request, reply, frames) by request seq
        self.order: ResponseOrder[int, tuple[Pending, Reply, list[Frame]]] | None = (
            ResponseOrder() if db is not None and db.preserve_ordering else None
        )
        self.error: str | None = None
        self.stats = ModelStats()
        self.metrics: ModelMetrics  # set by the observer when the state is created
        self.window = LatencyWindow()  # the last minute, for zinfer status
        self.generation = 0
        self.retired = False  # unloaded or replaced: drains its queue, then its workers stop for good
        self._groups: list[InstanceGroup | None] | None = None
        self.prefetching = False  # an instance has a second place in ``idle`` (GPU look-ahead)
        # a Triton model's own is_ready(): whether it has one (known once an instance reported its answer;
        # readiness queries then ask its instances to call it, ``ReadinessWaits.ask``), and the instances
        # asked whose call has not answered yet (one call in flight each)
        self.own_readiness = False
        self.readiness_asked: set[bytes] = set()

    def group_of(self, instance: int) -> InstanceGroup | None:
        """The instance group instance number ``instance`` belongs to."""
        if self._groups is None:
            self._groups = instance_groups(self.config, self.expected_instances)
        return self._groups[instance] if 0 <= instance < len(self._groups) else None

    @property
    def queued(self) -> int:
        """Requests waiting for an instance."""
        return len(self.scheduler)

    @property
    def ready(self) -> bool:
        return self.error is None and (bool(self.instances) or self.scheduler.plan is not None)

    @property
    def loading(self) -> bool:
        return self.error is None and len(self.instances) < self.expected_instances

    def state(self) -> str:
        if self.error is not None:
            return "UNAVAILABLE"
        return "READY" if self.instances or self.scheduler.plan is not None else "LOADING"


def scheduler_for(
    config: ModelConfig,
    instances: AbstractSet[bytes],
    expected: int,
    max_batch_bytes: int,
    plan: EnsemblePlan | None = None,
    pipelining: bool = True,
    one_row: bool = False,
) -> Scheduler:
    """The kind of a model: an ensemble's (``plan``), sequence batching, the dynamic batcher, or runs where
    ``pipelining`` (no execution limit, not decoupled) and nothing else asks for batches; around it the
    turns of the rate limiter where an instance group names resources. ``expected``: instances to place;
    ``instances``: the model's set of ready ones; ``one_row``: a sequence request holds one row."""
    if plan is not None:
        return EnsembleSteps(plan)
    limited = any(g.rate_limiter is not None for g in config.instance_group)
    kind: Scheduler
    if config.sequence_batching is not None:
        kind = Sequences(config, instances, one_row)
    else:
        policy = BatchPolicy.from_config(config, max(expected, 1), max_batch_bytes)
        runs = config.dynamic_batching is None and pipelining and not limited
        kind = Runs(policy) if runs else Batching(policy)
    return TakingTurns(kind) if limited else kind
