"""An ensemble request in progress (``Run``) and its tensors (``Value``), and the region check of its step
requests (``ServerRegions``: the client's own regions, and the server's slots), for ``ensemble_path``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zinfer.client.arena import Arena, Slot
from zinfer.client.errors import InternalError
from zinfer.client.protocol import Frame, ShmRef
from zinfer.client.shm import Segment

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
    shm: list[Any] | None = None  # [region, offset, nbytes]
    data: Frame | None = None

    def __init__(
        self, datatype: str, shape: list[int], shm: list[Any] | None = None, data: Frame | None = None
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
    client_slots: dict[str, list[Any]] = field(default_factory=dict)  # ensemble output → client's slot
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


def server_segment(arena: Arena, name: str) -> Segment | None:
    """The server's own segment of that name, or None (a client's region)."""
    return next((seg for seg in arena.segments if seg.name == name), None)


class ServerRegions:
    """The region check for a step's request: the client's own regions, and the server's slots."""

    def __init__(self, clients: RegionTable, arena: Arena) -> None:
        self.clients = clients
        self.arena = arena

    def check(self, client: bytes, ref: ShmRef) -> None:
        seg = server_segment(self.arena, ref.region)
        if seg is None:
            self.clients.check(client, ref)
        elif ref.offset < 0 or ref.nbytes < 0 or ref.offset + ref.nbytes > seg.size:
            raise InternalError("an ensemble tensor lies outside the server's region")
