"""``HttpWire``'s kept heads: a connection that sends the same request head again, whole in one read with its
body, has it taken without the parser (load generators and Triton's clients send the same head call after
call). What the handler gets must be exactly what the parser makes of the same bytes, and anything else
(another head, a read holding more or less than one request, a chunked body, ``Expect``, a closing
connection) must still go through the parser. On a real loopback socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.http_wire_helpers import DEADLINE_S, answer, listening, run
from zinfer.frontdoor.http_wire import KEPT_HEAD_BYTES, HttpRequest, HttpResponse, HttpWire

HEAD = (
    "POST /v2/models/add/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n"
    "Inference-Header-Content-Length: 4\r\nContent-Type: application/octet-stream\r\n"
    "Content-Length: {n}\r\n\r\n"
)


def _request(body: bytes, target: str = "/v2/models/add/infer", extra: str = "") -> bytes:
    head = HEAD.format(n=len(body)).replace("/v2/models/add/infer", target)
    return head.replace("\r\n\r\n", f"\r\n{extra}\r\n").encode() + body


class _Seen:
    """The handler: records what each request carried, answers with its body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.requests.append((request.method, request.target, dict(request.headers), request.body))
        assert request.recv_start_ns <= request.recv_end_ns
        return HttpResponse(200, (request.body,), "application/octet-stream")


class _Feeds:
    """The connection's parser, counting what it is fed."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


@asynccontextmanager
async def _server(seen: _Seen) -> AsyncIterator[tuple[int, list[HttpWire]]]:
    def make() -> HttpWire:
        wire = HttpWire(seen, lambda method, target: 1000, lambda w: None)
        wire._parser = _Feeds(wire._parser)  # type: ignore[assignment]
        return wire

    async with listening(make) as (port, wires):
        yield port, wires


async def _one_by_one(port: int, reads: list[bytes]) -> list[bytes]:
    """Each of ``reads`` written alone (the answers to what it holds awaited before the next); the bodies."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    bodies: list[bytes] = []
    try:
        for raw in reads:
            writer.write(raw)
            await writer.drain()
            for _ in range(raw.count(b" HTTP/1.1\r\n")):
                head, body = await answer(reader)
                assert head.startswith(b"HTTP/1.1 200"), head
                bodies.append(body)
    finally:
        writer.close()
    return bodies


def _fed(wires: list[HttpWire]) -> int:
    return sum(w._parser.fed for w in wires)  # type: ignore[attr-defined]


def test_a_repeated_head_is_taken_without_the_parser_exactly_as_the_parser_takes_it() -> None:
    bodies = [b"abcd" + bytes(range(8)), b"wxyz" + bytes(range(8, 16)), b"abcd" + bytes(range(8))]
    reads = [_request(b) for b in bodies]

    async def go() -> None:
        kept, parsed = _Seen(), _Seen()
        async with _server(kept) as (port, wires):
            assert await _one_by_one(port, reads) == bodies
            assert _fed(wires) == 1  # the first read only: the other two were the kept head again
        async with _server(parsed) as (port, wires):
            for raw in reads:  # each on a connection of its own: each parsed
                await _one_by_one(port, [raw])
            assert _fed(wires) == 3
        assert kept.requests == parsed.requests
        assert [r[3] for r in kept.requests] == bodies  # each its own body, not the first one's

    run(go())


def test_reads_other_than_the_kept_request_go_through_the_parser() -> None:
    first = _request(b"0123")
    other_target = _request(b"0123", target="/v2/models/abc/infer")  # as long as the kept read
    two_in_one = _request(b"4567") + _request(b"89ab")
    split = _request(b"cdef")

    async def go() -> None:
        seen = _Seen()
        async with _server(seen) as (port, wires):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                got: list[bytes] = []
                for raw in (first, other_target, two_in_one):
                    writer.write(raw)
                    for _ in range(raw.count(b" HTTP/1.1\r\n")):
                        got.append((await answer(reader))[1])
                writer.write(split[:-4])  # the head alone, then the body
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(split[-4:])
                got.append((await answer(reader))[1])
                writer.write(first[:-2])  # the kept head with part of its body, then the rest
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(first[-2:])
                got.append((await answer(reader))[1])
            finally:
                writer.close()
            assert got == [b"0123", b"0123", b"4567", b"89ab", b"cdef", b"0123"]
            assert [r[1] for r in seen.requests] == [
                "/v2/models/add/infer", "/v2/models/abc/infer", *["/v2/models/add/infer"] * 4
            ]  # fmt: skip
            assert _fed(wires) == 7  # every read was parsed

    run(go())


def test_chunked_expect_and_closing_heads_are_never_kept() -> None:
    chunked = (
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )

    async def go() -> None:
        seen = _Seen()
        async with _server(seen) as (port, wires):
            assert await _one_by_one(port, [chunked, chunked, chunked]) == [b"abcde"] * 3
            assert _fed(wires) == 3
        async with _server(seen) as (port, wires):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                expect = _request(b"wxyz", extra="Expect: 100-continue\r\n")
                for _ in range(2):
                    writer.write(expect)
                    head, body = await answer(reader)
                    assert head.startswith(b"HTTP/1.1 200") and body == b"wxyz"
            finally:
                writer.close()
            assert _fed(wires) == 2
        async with _server(seen) as (port, wires):
            closing = _request(b"zz", extra="Connection: close\r\n")
            for _ in range(2):  # the connection closes after each: a kept head would not outlive it anyway
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(closing)
                out = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
                writer.close()
                assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"zz")
            assert all(w._kept is None for w in wires)

    run(go())


def test_a_long_head_is_not_kept() -> None:
    """An idle connection holds at most ``KEPT_HEAD_BYTES`` of a head: a longer one is parsed every time."""
    long_head = _request(b"long", extra=f"X-Pad: {'p' * KEPT_HEAD_BYTES}\r\n")
    short_head = _request(b"shrt")

    async def go() -> None:
        seen = _Seen()
        async with _server(seen) as (port, wires):
            assert await _one_by_one(port, [long_head] * 3) == [b"long"] * 3
            assert _fed(wires) == 3 and all(w._kept is None for w in wires)
        async with _server(seen) as (port, wires):
            assert await _one_by_one(port, [short_head] * 3) == [b"shrt"] * 3
            assert _fed(wires) == 1

    run(go())
