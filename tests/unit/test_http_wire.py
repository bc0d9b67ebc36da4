"""The HTTP door's connections (``frontdoor.http_wire.HttpWire``) on a real loopback socket: requests are
answered whole and in order, keep-alive and closing follow HTTP/1.1, and what a hostile peer sends (huge
headers or bodies, stalls, garbage, a handler that fails) gets a clear status and a closed connection,
never a hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from tests.http_wire_helpers import DEADLINE_S, get, listening, run, talk
from zinfer.frontdoor import http_wire
from zinfer.frontdoor.http_wire import HttpRequest, HttpResponse, HttpWire

LIMIT = 1000


async def _echo(request: HttpRequest) -> HttpResponse:
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    if request.path == "/fail":
        raise RuntimeError("a bug in the handler")
    if request.path == "/big":
        return HttpResponse(200, (b"x" * (8 << 20),), "application/octet-stream")
    text = f"{request.method} {request.target} {len(request.body)} {request.body[:20]!r}".encode()
    return HttpResponse(200, (text,), "text/plain", {"X-Seen": request.headers.get("x-tag", "-")})


@asynccontextmanager
async def _server(
    handler: Callable[[HttpRequest], Awaitable[HttpResponse]] = _echo,
    header_timeout: float = 10.0,
    admit: Callable[[HttpWire], bool] | None = None,
) -> AsyncIterator[int]:
    def make() -> HttpWire:
        return HttpWire(
            handler, lambda method, target: LIMIT, lambda wire: None,
            header_timeout=header_timeout, admit=admit,
        )  # fmt: skip

    async with listening(make) as (port, _):
        yield port


def test_pipelined_requests_are_answered_whole_and_in_order() -> None:
    async def go() -> None:
        async with _server() as port:
            raw = get("/slow", "X-Tag: one\r\n") + get("/fast?q=1", "X-Tag: two\r\n")
            raw += b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
            out = await talk(port, raw)
            first, second, third = (
                out.index(b"GET /slow"),
                out.index(b"GET /fast?q=1"),
                out.index(b"POST /p 5"),
            )
            assert first < second < third
            assert out.count(b"HTTP/1.1 200 OK") == 3 and b"X-Seen: one" in out and b"X-Seen: two" in out
            assert out.rstrip().endswith(b"b'hello'")  # closed after the answer Connection: close asked for

    run(go())


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async def go() -> None:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for i in range(3):
                    writer.write(get(f"/n{i}"))
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    body = await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
                    assert head.startswith(b"HTTP/1.1 200") and body.startswith(f"GET /n{i} ".encode())
                    assert b"Connection: close" not in head
            finally:
                writer.close()

    run(go())


def test_http_1_0_and_a_half_closed_peer_get_their_answer_then_the_connection_closes() -> None:
    async def go() -> None:
        async with _server() as port:
            out = await talk(port, b"GET /old HTTP/1.0\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 200") and b"Connection: close" in out and b"GET /old" in out
            out = await talk(port, get("/half"), half_close=True)
            assert out.startswith(b"HTTP/1.1 200") and b"GET /half" in out

    run(go())


def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async def go() -> None:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
                )
                interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
                assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(b"abc")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
                assert head.startswith(b"HTTP/1.1 200")
            finally:
                writer.close()

    run(go())


def test_chunked_bodies_are_joined_and_bounded() -> None:
    async def go() -> None:
        async with _server() as port:
            chunked = (
                b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            out = await talk(port, chunked + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            assert b"POST /c 5 b'abcde'" in out
            over = chunked + (b"200\r\n" + b"z" * 0x200 + b"\r\n") * 3 + b"0\r\n\r\n"  # 1536 bytes > LIMIT
            out = await talk(port, over)
            assert out.startswith(b"HTTP/1.1 400") and b"more than the limit of 1000 bytes" in out

    run(go())


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent() -> None:
    async def go() -> None:
        async with _server() as port:
            out = await talk(port, b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 400") and b"99999999999 bytes is more than the limit" in out

    run(go())


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(700)) + b"\r\n",
    ],
    ids=["long-target", "many-headers"],
)
def test_a_head_over_the_limit_is_refused_431(raw: bytes) -> None:
    async def go() -> None:
        async with _server() as port:
            out = await talk(port, raw)
            assert out.startswith(b"HTTP/1.1 431") and b"Connection: close" in out

    run(go())


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  # a TLS hello on the plain port
    ],
)
def test_malformed_requests_are_answered_400_and_closed(raw: bytes) -> None:
    async def go() -> None:
        async with _server() as port:
            out = await talk(port, raw)
            assert out.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in out
            assert (await talk(port, get("/after", "Connection: close\r\n"))).startswith(b"HTTP/1.1 200")

    run(go())


def test_a_stalled_request_is_answered_408_and_an_idle_connection_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_wire, "REQUEST_TIMEOUT_S", 0.2)
    monkeypatch.setattr(http_wire, "KEEPALIVE_S", 0.3)

    async def go() -> None:
        async with _server(header_timeout=0.25) as port:
            loop = asyncio.get_running_loop()
            start = loop.time()
            out = await talk(port, b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf")
            assert out.startswith(b"HTTP/1.1 408") and b"request did not arrive within 0.2 s" in out
            out = await talk(port, b"GET /trickle HTTP/1.1\r\nHo")  # the head never ends
            assert out.startswith(b"HTTP/1.1 408") and b"headers did not arrive within 0.25 s" in out
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:  # says nothing at all: closed once idle, with no answer
                assert await asyncio.wait_for(reader.read(-1), DEADLINE_S) == b""
            finally:
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:  # one whole request, answered; then idle: closed with nothing more said
                writer.write(get("/once"))
                out = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
                assert out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1") == 1
            finally:
                writer.close()
            assert loop.time() - start < 5.0

    run(go())


def test_a_trickled_head_is_cut_at_the_header_deadline_however_steady_the_trickle() -> None:
    """Slowloris: a byte every 50 ms keeps no connection alive past the head deadline (0.3 s here)."""

    async def go() -> None:
        async with _server(header_timeout=0.3) as port:
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = loop.time()
            try:
                writer.write(b"GET / HTTP/1.1\r\n")
                while not reader.at_eof() and loop.time() - start < DEADLINE_S:
                    writer.write(b"X")
                    await asyncio.sleep(0.05)
                    if reader._buffer:  # type: ignore[attr-defined]  # the answer came
                        break
                out = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
            finally:
                writer.close()
            assert out.startswith(b"HTTP/1.1 408") and b"headers did not arrive within 0.3 s" in out
            assert loop.time() - start < 3.0

    run(go())


def test_a_busy_keep_alive_connection_keeps_its_deadlines_across_requests() -> None:
    """One timer per connection stays armed across requests: requests answered back to back for longer than
    the head deadline are all answered, and the next head that stalls is still cut at its own deadline."""

    async def go() -> None:
        async with _server(header_timeout=0.3) as port:
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                start = loop.time()
                answered = 0
                while loop.time() - start < 1.0:  # more than three head deadlines of requests
                    writer.write(get(f"/n{answered}"))
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
                    assert head.startswith(b"HTTP/1.1 200"), head
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)
                    answered += 1
                    await asyncio.sleep(0.01)
                assert answered > 10
                stalled = loop.time()
                writer.write(b"GET /stalled HTTP/1.1\r\nHo")  # the next head never ends
                out = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
            finally:
                writer.close()
            assert out.startswith(b"HTTP/1.1 408") and b"headers did not arrive within 0.3 s" in out
            assert 0.25 <= loop.time() - stalled < 3.0

    run(go())


def test_admit_may_refuse_a_connection_and_requests_carry_the_peers_uid() -> None:
    import os

    seen: list[HttpWire] = []

    def admit(wire: HttpWire) -> bool:
        seen.append(wire)
        return len(seen) == 1

    async def go() -> None:
        async with _server(admit=admit) as port:
            out = await talk(port, get("/who", "Connection: close\r\n"))
            assert out.startswith(b"HTTP/1.1 200")
            assert seen[0].peer_uid == os.getuid()  # loopback: the kernel names the peer's user
            assert await talk(port, get("/refused")) == b""  # refused: closed, nothing read or said

    run(go())


def test_a_failing_handler_is_a_500_answer_and_the_server_goes_on() -> None:
    async def go() -> None:
        async with _server() as port:
            out = await talk(port, get("/fail"))
            assert out.startswith(b"HTTP/1.1 500") and b'{"error":"internal error"}' in out
            assert (await talk(port, get("/ok", "Connection: close\r\n"))).startswith(b"HTTP/1.1 200")

    run(go())


def test_a_large_answer_arrives_whole_to_a_reader_that_lags() -> None:
    async def go() -> None:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=4096)
            try:
                writer.write(get("/big") + get("/after", "Connection: close\r\n"))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
                assert b"Content-Length: 8388608" in head
                await asyncio.sleep(0.3)  # not reading: the answer backs up in the server, still whole
                body = await asyncio.wait_for(reader.readexactly(8 << 20), DEADLINE_S)
                rest = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
                assert body == b"x" * (8 << 20) and rest.startswith(b"HTTP/1.1 200") and b"GET /after" in rest
            finally:
                writer.close()

    run(go())


def test_reason_phrases_and_the_error_body_are_well_formed() -> None:
    response = http_wire.plain(404, 'no "such" \\ model')
    assert response.head(keep_alive=False).startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"".join(response.body) == b'{"error":"no \\"such\\" \\\\ model"}'
    assert HttpResponse(299).head(keep_alive=True).startswith(b"HTTP/1.1 299 Unknown\r\n")
