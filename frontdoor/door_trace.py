"""The front door's own timestamps of a traced request, as Triton records them, handed to the broker.

A reply whose request the broker traced carries the trace's token (``protocol.TRACE_ID``, removed before
the caller sees the reply). Once the answer has left, the door sends its timestamps under that token:
HTTP ``HTTP_RECV_START`` (the request's first byte parsed), ``HTTP_RECV_END`` (its last), ``HTTP_SEND_START``
and ``HTTP_SEND_END`` (around the answer's write to the socket); gRPC ``GRPC_WAITREAD_START`` and
``GRPC_WAITREAD_END`` (around the door's reading of the request the gRPC library decoded: the library's own
read is not seen, as in Triton), ``GRPC_SEND_START`` (the response handed to the library) and
``GRPC_SEND_END`` (the call finished). All are ``CLOCK_MONOTONIC`` ns, the broker's clock too. Each send is
a task of its own, never awaited by an answer; at most ``MAX_PENDING`` are in flight (more are dropped).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger(__name__)

MAX_PENDING = 256

Send = Callable[[str, Sequence[tuple[str, int]]], Awaitable[bool]]


class DoorStamps:
    def __init__(self, send: Send) -> None:
        self._send = send  # ``AsyncClient.add_trace_stamps``
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    def add(self, trace: str, stamps: Sequence[tuple[str, int]]) -> None:
        """Send ``stamps`` for the trace ``trace`` (a reply's token) in the background."""
        if len(self._tasks) >= MAX_PENDING:
            self.dropped += 1
            return
        task = asyncio.get_running_loop().create_task(self._one(trace, stamps))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, trace: str, stamps: Sequence[tuple[str, int]]) -> None:
        try:
            await self._send(trace, stamps)
        except Exception as exc:  # noqa: BLE001 - a trace's extra stamps are not worth failing anything
            log.debug("event=trace_stamps_failed error=%r", str(exc))
