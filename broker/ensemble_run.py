"""An ensemble request in progress (``Run``) and its tensors (``Value``), the server's slots for
intermediates (``ServerSlots``: the arena, its segments by name, and slots kept for reuse), and the region
check of its step requests (``ServerRegions``: the client's own regions, and the server's slots), for
``ensemble_path``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod

from zinfer.client import dtypes
from zinfer.client.arena import Arena, Slot
from zinfer.client.errors import InternalError, ResourceExhausted
from zinfer.client.protocol import Frame, ShmRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.signature import Signature

from .ensemble_plan import EnsemblePlan
from .model_state import ModelState, Pending
from .regions import RegionTable


@dataclass(init=False)
class Value:
    """One tensor of a run: in a region (``shm``) or as an inline frame (``data``). (The records here have
    their own ``__init__``: built per step, and under mypyc a dataclass's generated one runs as interpreted
    code.)"""

    datatype: str
    shape: list[int]
    shm: ShmRef | None = None
    data: Frame | None = None

    def __init__(
        self, datatype: str, shape: list[int], shm: ShmRef | None = None, data: Frame | None = None
    ) -> None:
        self.datatype = datatype
        self.shape = shape
        self.shm = shm
        self.data = data


@dataclass(init=False)
class Run:
    """One ensemble request in progress."""

    state: ModelState
    p: Pending
    plan: EnsemblePlan
    tensors: dict[str, Value] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    outstanding: dict[int, tuple[ModelState, Pending]] = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)
    client_slots: dict[str, ShmRef] = field(default_factory=dict)  # ensemble output → client's slot
    finished: bool = False

    def __init__(self, state: ModelState, p: Pending, plan: EnsemblePlan) -> None:
        self.state = state
        self.p = p
        self.plan = plan
        self.tensors = {}
        self.started = set()
        self.done = set()
        self.outstanding = {}
        self.slots = []
        self.client_slots = {}
        self.finished = False


KEEP_SLOTS = 256  # freed slots kept for reuse, at most
KEEP_BYTES = 16 << 20  # and at most this many bytes of them


class ServerSlots:
    """The server's slots for intermediates: carved from ``arena`` (which makes its segments with
    ``make``), and a request's freed slots kept for the next of the same size (up to ``KEEP_SLOTS`` and
    ``KEEP_BYTES``): an ensemble's steps ask for the same few sizes request after request, and a slot
    taken back is a dict look-up where the arena walks its free lists under its lock. The kept ones go
    back to the arena when it cannot serve a request otherwise."""

    def __init__(self, initial_bytes: int, max_bytes: int, make: Callable[[int], Segment]) -> None:
        self._make = make
        self.segments: dict[str, Segment] = {}  # every segment of the arena, by name (it only adds)
        self.arena = Arena(initial_bytes, max_bytes, new_segment=self._new_segment)
        self._kept: dict[int, list[Slot]] = {}  # by nbytes
        self._kept_count = 0
        self._kept_bytes = 0

    def _new_segment(self, size: int) -> Segment:
        seg = self._make(size)
        self.segments[seg.name] = seg
        return seg

    def alloc(self, nbytes: int) -> Slot:
        """A slot of ``nbytes``; ``ResourceExhausted`` or ``OSError`` when the arena has no room."""
        kept = self._kept.get(nbytes)
        if kept:
            self._kept_count -= 1
            self._kept_bytes -= nbytes
            return kept.pop()
        try:
            return self.arena.alloc(nbytes)
        except (ResourceExhausted, OSError):
            if not self._kept_count:
                raise
        self.flush()  # what is kept goes back, and the arena tries again
        return self.arena.alloc(nbytes)

    def free(self, slot: Slot) -> None:
        nbytes = slot.nbytes
        if self._kept_count >= KEEP_SLOTS or self._kept_bytes + nbytes > KEEP_BYTES:
            self.arena.free(slot)
            return
        kept = self._kept.get(nbytes)
        if kept is None:
            self._kept[nbytes] = [slot]
        else:
            kept.append(slot)
        self._kept_count += 1
        self._kept_bytes += nbytes

    def flush(self) -> None:
        """Every kept slot back to the arena."""
        for slots in self._kept.values():
            for slot in slots:
                self.arena.free(slot)
        self._kept.clear()
        self._kept_count = 0
        self._kept_bytes = 0

    def close(self) -> None:
        self._kept.clear()
        self._kept_count = 0
        self._kept_bytes = 0
        self.arena.close()


class ServerRegions:
    """The region check for a step's request: the client's own regions, and the server's slots."""

    def __init__(self, clients: RegionTable, segments: dict[str, Segment]) -> None:
        self.clients = clients
        self.segments = segments  # the server's own, by name (``ServerSlots.segments``)

    def check(self, client: bytes, ref: ShmRef) -> None:
        seg = self.segments.get(ref.region)
        if seg is None:
            self.clients.check(client, ref)
        elif ref.offset < 0 or ref.nbytes < 0 or ref.offset + ref.nbytes > seg.size:
            raise InternalError("an ensemble tensor lies outside the server's region")


# per signature (by id, the signature held to tell a reused id): each output's bytes per row, -1 where the
# config does not fix them; and whether the model batches. Worked out once, not per step request.
_ROW_BYTES: dict[int, tuple[Signature, bool, dict[str, int]]] = {}
_MAX_SIGNATURES = 1024  # one per model version loaded; past it the cache starts over


def output_row_bytes(sig: Signature, output: str) -> tuple[int, bool]:
    """The bytes of one batch row of ``sig``'s output ``output`` (of the whole tensor when the model does
    not batch) when its config fixes them, else -1 (BYTES, a variable dim, an unknown output); and whether
    the model batches."""
    entry = _ROW_BYTES.get(id(sig))
    if entry is None or entry[0] is not sig:
        if len(_ROW_BYTES) >= _MAX_SIGNATURES:
            _ROW_BYTES.clear()
        entry = (sig, sig.batching, {})
        _ROW_BYTES[id(sig)] = entry
    row = entry[2].get(output)
    if row is None:
        spec = sig.outputs.get(output)
        row = -1
        if spec is not None and spec.wire != dtypes.BYTES and all(d >= 0 for d in spec.dims):
            row = prod(spec.dims) * spec.itemsize
        entry[2][output] = row
    return row, entry[1]
