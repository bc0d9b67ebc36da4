"""A request on its way through the broker (``Pending``): queued, then running, until it is answered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zinfer.client.protocol import Frame, InferRequest, OutputRequest, Reply
from zinfer.client.worker_protocol import RequestResult, SequenceFlags

if TYPE_CHECKING:
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
