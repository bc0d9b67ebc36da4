"""The scheduler of a stateful model (``sequence_batching``): each sequence bound to one instance at its
START, its requests in order, one at a time (``batching.sequence_batcher``), in the shape every scheduler
has (``scheduler``). ``add`` checks the request's sequence id and flags against the model's controls,
with Triton's texts. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence, Set

from zinfer.client.errors import InvalidArgument
from zinfer.client.worker_protocol import SequenceFlags
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.sequence_batching import control_specs

from .batching.sequence_batcher import (
    NotStarted,
    SequenceBatcher,
    SequenceError,
    SequencePolicy,
    SequenceRequest,
    parse_sequence,
)
from .pending import Pending
from .scheduler import Ready, Scheduler


class Sequences(Scheduler):
    """Sequence batching: each sequence bound to one of the model's ``instances`` at its START."""

    def __init__(self, config: ModelConfig, instances: Set[bytes], one_row: bool) -> None:
        super().__init__()
        sb = config.sequence_batching
        assert sb is not None
        self.name = config.name
        self.batcher: SequenceBatcher[Pending, bytes] = SequenceBatcher(
            SequencePolicy.of(sb, config.max_batch_size)
        )
        self.controls = control_specs(sb)
        self.cacheable = False  # each request moves its sequence's state on
        self.instances = instances  # the model's (``ModelState.instances``), read at each START
        self.one_row = one_row  # its requests must hold one row (the model batches)

    def __len__(self) -> int:
        return len(self.batcher)

    def has_work(self) -> bool:
        return bool(self.batcher.active() or len(self.batcher))

    def active(self) -> int:
        return self.batcher.active()

    def add(self, p: Pending, shape_key: Hashable, now: float, busy: bool) -> None:
        p.sequence = self._flags(p)
        try:
            self.batcher.add(SequenceRequest(p, p.sequence.id, p.sequence.start, p.sequence.end, now),
                             now, sorted(self.instances))  # fmt: skip
        except NotStarted as unstarted:  # Triton's text, which clients match on
            raise InvalidArgument(
                f"inference request for sequence {unstarted.sequence_id} to model '{self.name}' must specify "
                "the START flag on the first request of the sequence"
            ) from None
        except SequenceError as broken:  # (one name per handler: see scheduler.Batching.add)
            raise InvalidArgument(str(broken)) from None

    def _flags(self, p: Pending) -> SequenceFlags:
        """The request's sequence id and flags, checked against the model's controls."""
        try:
            parsed = parse_sequence(p.request.parameters)
        except SequenceError as exc:
            raise InvalidArgument(str(exc)) from None
        if parsed is None:
            raise InvalidArgument(
                f"inference request to model '{self.name}' must specify a non-zero or non-empty sequence_id"
            )
        sid, start, end = parsed
        if isinstance(sid, str):
            for c in self.controls:
                if c["kind"] == "CORRID" and c["data_type"] != "TYPE_STRING":
                    raise InvalidArgument(
                        f"inference request for sequence '{sid}' to model '{self.name}': a string "
                        f"sequence_id needs the CORRID control '{c['name']}' to be TYPE_STRING, the model "
                        f"has {c['data_type']}"
                    )  # never a made-up id: the model would see 0 for every such sequence
        if self.one_row and p.batch_size != 1:
            raise InvalidArgument(f"a sequence request must hold one row, got a batch of {p.batch_size}")
        return SequenceFlags(sid, start, end)

    def pop_ready(self, now: float, idle: Sequence[bytes]) -> Ready:
        return [(w, [b]) for w, b in self.batcher.pop_ready(now, list(idle))]

    def pop_one(self, now: float, free: Sequence[bytes]) -> Ready:
        got = self.batcher.pop_one(now, free)
        return [] if got is None else [(got[0], [got[1]])]

    def next_deadline(self, idle: Sequence[bytes]) -> float | None:
        return self.batcher.next_deadline(list(idle))

    def next_expiry(self) -> float | None:
        return self.batcher.next_expiry()

    def expire(self, now: float) -> list[Pending]:
        return self.batcher.expire(now)  # idle sequences are released; none of them has a queued request

    def remove(self, predicate: Callable[[Pending], bool]) -> list[Pending]:
        return self.batcher.remove(predicate)

    def done(self, requests: Iterable[Pending], now: float) -> None:
        self.batcher.done([p.sequence.id for p in requests if p.sequence is not None], now)

    def drop_instance(self, instance: bytes) -> list[Pending]:
        return self.batcher.drop_instance(instance)
