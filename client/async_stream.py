"""``AsyncConnection.stream``'s replies as an async generator. mypyc compiles no async generator, so it lives
here, apart from the connection (which may then be compiled); it uses the connection's ``open_stream``,
``send_stream`` and ``close_stream`` only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from . import protocol
from .errors import ClientError, RequestTimeout
from .protocol import Command, Frame, Reply, is_final

if TYPE_CHECKING:
    from .async_connection import AsyncConnection

__all__ = ["replies"]


async def replies(
    conn: AsyncConnection,
    command: Command,
    header: protocol.OutHeader,
    frames: Sequence[Frame],
    timeout: float,
) -> AsyncIterator[tuple[Reply, list[Frame]]]:
    """Send one message on ``conn``; yield its replies until the final one (``timeout`` bounds each wait)."""
    rid, queue = conn.open_stream(header)
    done = False
    try:
        conn.send_stream(command, header, frames, rid, timeout)
        while not done:
            try:
                item = await asyncio.wait_for(queue.get(), timeout)
            except asyncio.TimeoutError:
                raise RequestTimeout("no response from the server within the timeout") from None
            if isinstance(item, ClientError):
                raise item
            reply, rframes = item
            done = is_final(reply)
            yield reply, rframes
    finally:
        conn.close_stream(rid, done)
