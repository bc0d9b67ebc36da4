"""A request on its way through the broker (``Pending``): queued, then running, until it is answered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zinfer.client.protocol import Frame, InferRequest, OutputRequest, Reply
from zinfer.client.worker_protocol import RequestResult, SequenceFlags

if TYPE_CHECKING:
    from .tracing import Trace


@dataclass(init=False)
class Pending:
    """A queued or running request: its checked ``request`` (inputs passed on to the worker as they
    arrived, but for inline frame numbers) and the ``outputs`` it gets. (Its own ``__init__``: built per
    request and per ensemble step, and under mypyc a dataclass's generated one runs as interpreted code.)"""

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

    def __init__(
        self,
        seq: int,
        client: bytes,
        request: InferRequest,
        frames: list[Frame],
        outputs: tuple[OutputRequest, ...],
        batch_size: int,
        arrival: float,
        cancelled: bool = False,
        cache_key: bytes | None = None,
        sequence: SequenceFlags | None = None,
        on_done: Callable[[Reply, list[Frame]], None] | None = None,
        on_outputs: Callable[[RequestResult, list[Frame]], None] | None = None,
        input_bytes: int = 0,
        trace: Trace | None = None,
    ) -> None:
        self.seq = seq
        self.client = client
        self.request = request
        self.frames = frames
        self.outputs = outputs
        self.batch_size = batch_size
        self.arrival = arrival
        self.cancelled = cancelled
        self.cache_key = cache_key
        self.sequence = sequence
        self.on_done = on_done
        self.on_outputs = on_outputs
        self.input_bytes = input_bytes
        self.trace = trace
