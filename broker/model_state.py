"""What the broker knows about one loaded model version: its queue, its instances and its statistics."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zinfer.client.protocol import Frame, InferRequest, OutputRequest, Reply
from zinfer.client.worker_protocol import RequestResult, SequenceFlags
from zinfer.modelconfig.instances import InstanceGroup
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.parameters import execution_limit_ns
from zinfer.modelconfig.sequence_batching import control_specs
from zinfer.modelconfig.signature import Signature

from .batching.batcher import BatchPolicy, DynamicBatcher
from .batching.ordering import ResponseOrder
from .batching.runs import ExecutionCost
from .batching.sequence_batcher import SequenceBatcher, SequencePolicy
from .latency_window import LatencyWindow, log_bin
from .metrics import ModelMetrics

if TYPE_CHECKING:
    from .ensemble_plan import EnsemblePlan
    from .tracing import Trace


@dataclass
class Pending:
    """A queued or running request: its checked ``request`` (inputs passed on to the worker as they
    arrived, but for inline frame numbers) and the ``outputs`` it gets."""

    seq: int
    client: bytes
    request: InferRequest
    frames: list[Frame]
    outputs: tuple[OutputRequest, ...]  # those the request asked for, or every output of the model
    batch_size: int
    arrival: float
    cancelled: bool = False  # cancelled while running: its result is discarded
    cache_key: bytes | None = None  # missed the response cache: its result is stored under this key
    # a sequence request: its id and flags (the model's control inputs are added at dispatch)
    sequence: SequenceFlags | None = None
    # an ensemble step's request: its reply goes to this callback instead of to ``client``
    on_done: Callable[[Reply, list[Frame]], None] | None = None
    # and its success as the worker sent it (no client reply built), where no ordering or cache needs one
    on_outputs: Callable[[RequestResult, list[Frame]], None] | None = None
    input_bytes: int = 0  # counted against the server's max_batch_bytes
    trace: Trace | None = None  # sampled for tracing (``tracing.Tracer.start``)


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


@dataclass
class InFlight:
    batch_id: int
    worker: bytes
    model: ModelState
    requests: list[Pending]
    sent_ns: int
    executions: int = 1  # a run (``batching.runs``): each request its own execution


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
    def __init__(
        self, config: ModelConfig, version: int, version_dir: Path, instances: int, max_batch_bytes: int = 0
    ) -> None:
        self.config = config
        self.signature = Signature.of(config)
        self.name = config.name
        self.version = version
        self.version_dir = version_dir
        self.expected_instances = instances
        policy = BatchPolicy.from_config(config, max(instances, 1), max_batch_bytes)  # an ensemble has none
        self.batcher: DynamicBatcher[Pending] = DynamicBatcher(policy)
        db = config.dynamic_batching
        # with preserve_ordering, responses leave in arrival order: (request, reply, frames) by request seq
        self.order: ResponseOrder[int, tuple[Pending, Reply, list[Frame]]] | None = (
            ResponseOrder() if db is not None and db.preserve_ordering else None
        )
        sb = config.sequence_batching
        # a stateful model: its requests go through the sequence batcher instead of ``batcher``
        self.sequencer: SequenceBatcher[Pending, bytes] | None = (
            SequenceBatcher(SequencePolicy.of(sb, config.max_batch_size)) if sb is not None else None
        )
        self.controls: list[dict[str, Any]] = control_specs(sb) if sb is not None else []
        self.instances: set[bytes] = set()
        self.idle: deque[bytes] = deque()
        self.error: str | None = None
        self.stats = ModelStats()
        self.metrics: ModelMetrics  # set by the observer when the state is created
        self.window = LatencyWindow()  # the last minute, for zinfer status
        self.generation = 0
        self.retired = False  # unloaded or replaced: drains its queue, then its workers stop for good
        self.rate_limited = any(g.rate_limiter is not None for g in config.instance_group)
        self._groups: list[InstanceGroup | None] | None = None
        self.prefetching = False  # an instance has a second place in ``idle`` (GPU look-ahead)
        # a Triton model's own is_ready(): how a readiness query (client, request id) asks its instances to
        # call it (set once they report it, ``ReadinessWaits.ask``), and those asked whose call has not
        # answered yet (one call in flight each)
        self.ask_ready: Callable[[bytes, str], None] | None = None
        self.readiness_asked: set[bytes] = set()
        self.runs = False  # its instances take runs of requests, each executed alone (``batching.runs``)
        self.cost = ExecutionCost()  # one execution's time on an instance, from the workers' timings
        self.ensemble: EnsemblePlan | None = None  # an ensemble: no instances, the broker runs its steps
        # the longest a batch may run on an instance (parameter execution_timeout_ms); None: no limit
        self.execution_limit_ns = execution_limit_ns(config)

    def group_of(self, instance: int) -> InstanceGroup | None:
        """The instance group instance number ``instance`` belongs to."""
        if self._groups is None:
            self._groups = instance_groups(self.config, self.expected_instances)
        return self._groups[instance] if 0 <= instance < len(self._groups) else None

    @property
    def queued(self) -> int:
        """Requests waiting for an instance, in the batcher or the sequence batcher."""
        return len(self.batcher) + (len(self.sequencer) if self.sequencer is not None else 0)

    @property
    def ready(self) -> bool:
        return self.error is None and (bool(self.instances) or self.ensemble is not None)

    @property
    def loading(self) -> bool:
        return self.error is None and len(self.instances) < self.expected_instances

    def state(self) -> str:
        if self.error is not None:
            return "UNAVAILABLE"
        return "READY" if self.instances or self.ensemble is not None else "LOADING"
