"""Shared by the tests of the HTTP door's connections (``frontdoor.http_wire.HttpWire``): a loopback server of
wires, a peer that talks to it, reading answers, and running a test's coroutine under a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from zinfer.frontdoor.http_wire import HttpWire

DEADLINE_S = 10.0  # every read of an answer waits at most this long


@asynccontextmanager
async def listening(make: Callable[[], HttpWire]) -> AsyncIterator[tuple[int, list[HttpWire]]]:
    """A server on 127.0.0.1 whose connections are ``make()``'s wires: (its port, every wire made); the server
    and every wire are closed on the way out."""
    wires: list[HttpWire] = []

    def connect() -> HttpWire:
        wire = make()
        wires.append(wire)
        return wire

    server = await asyncio.get_running_loop().create_server(connect, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], wires
    finally:
        server.close()
        for wire in wires:
            wire.close()


def get(path: str, extra: str = "", version: str = "1.1") -> bytes:
    """A GET of ``path`` with a Host header and ``extra`` header lines."""
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()


async def talk(port: int, raw: bytes, half_close: bool = False) -> bytes:
    """Send ``raw`` (then end the sending side with ``half_close``); everything the server sends until it
    closes, or until the deadline."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        if half_close:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(-1), DEADLINE_S)
    finally:
        writer.close()


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next answer's head and body (its Content-Length's worth); an interim ``100 Continue`` is passed
    over."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    if head == b"HTTP/1.1 100 Continue\r\n\r\n":  # the interim answer to ``Expect``: the answer follows
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    return head, await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)


async def answers(reader: asyncio.StreamReader, n: int) -> list[tuple[bytes, bytes]]:
    """The next ``n`` answers, as ``answer`` reads each."""
    return [await answer(reader) for _ in range(n)]


def run(coro: Awaitable[None], timeout_s: float = 30.0) -> None:
    """Run a test's coroutine on a fresh loop; it fails if it takes longer than ``timeout_s``."""
    asyncio.run(asyncio.wait_for(coro, timeout_s))  # type: ignore[arg-type]
