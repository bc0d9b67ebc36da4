"""``HttpWire``'s ``start``: a request the handler takes without a coroutine (the HTTP door's direct path) is
answered as a handler's answer is: whole, in order with the requests pipelined behind it, keep-alive and
closing as HTTP/1.1 says, its ``on_sent`` told once written, on a real loopback socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from tests.http_wire_helpers import DEADLINE_S, answers, get, listening, run, talk
from zinfer.frontdoor.http_wire import HttpRequest, HttpResponse, HttpWire


async def _handler(request: HttpRequest) -> HttpResponse:
    if request.path == "/slow":
        await asyncio.sleep(0.05)
    return HttpResponse(200, (f"handler {request.target} {len(request.body)}".encode(),), "text/plain")


class _Starter:
    """Takes ``/direct...`` targets: answers them from the loop after ``delay`` (``/direct-big``: 8 MiB)."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.taken: list[str] = []
        self.sent: list[tuple[str, int, int]] = []

    def __call__(self, request: HttpRequest, done: Callable[[HttpResponse], None]) -> bool:
        if not request.path.startswith("/direct"):
            return False
        if self.fail:
            raise RuntimeError("a bug in start")
        self.taken.append(request.target)
        target = request.target
        body: bytes = b"x" * (8 << 20) if request.path == "/direct-big" else f"direct {target}".encode()

        def on_sent(start: int, end: int) -> None:
            self.sent.append((target, start, end))

        answer = HttpResponse(
            200, (body,), "text/plain", close=request.path == "/direct-close", on_sent=on_sent
        )
        asyncio.get_running_loop().call_later(self.delay, done, answer)
        return True


@asynccontextmanager
async def _server(start: _Starter) -> AsyncIterator[tuple[int, list[HttpWire]]]:
    async with listening(
        lambda: HttpWire(_handler, lambda method, target: 1000, lambda w: None, start=start)
    ) as (
        port,
        wires,
    ):
        yield port, wires


def test_started_and_handled_requests_are_answered_in_order_on_one_connection() -> None:
    async def go() -> None:
        start = _Starter(delay=0.05)
        async with _server(start) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                # one at a time; then pipelined behind one start took, and behind a slow one
                for path in ("/direct?a", "/h1", "/direct?b"):
                    writer.write(get(path))
                    ((head, body),) = await answers(reader, 1)
                    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
                    assert path.encode() in body.split(b" ")
                paths = ["/direct?c", "/h2", "/direct?d", "/slow", "/direct?e", "/h3"]
                writer.write(b"".join(get(p) for p in paths))
                got = await answers(reader, len(paths))
                assert [body.split(b" ")[1] for _, body in got] == [p.encode() for p in paths]
                assert [body.split(b" ")[0] for _, body in got] == [
                    b"direct",
                    b"handler",
                    b"handler",
                    b"handler",
                    b"handler",
                    b"handler",
                ]  # fmt: skip (taken by start only when nothing waits before it)
                writer.write(get("/direct?f"))
                ((_, body),) = await answers(reader, 1)
                assert body == b"direct /direct?f"  # the connection is idle again: start takes it
            finally:
                writer.close()
        assert start.taken == ["/direct?a", "/direct?b", "/direct?c", "/direct?f"]
        assert [t for t, _, _ in start.sent] == start.taken
        assert all(0 < begin <= end for _, begin, end in start.sent)

    run(go(), 60)


def test_a_started_answer_closes_when_http_says_so() -> None:
    async def go() -> None:
        async with _server(_Starter(delay=0.02)) as (port, _):
            out = await talk(port, get("/direct", version="1.0"))
            assert (
                out.startswith(b"HTTP/1.1 200") and b"Connection: close" in out and out.endswith(b"/direct")
            )
            out = await talk(port, get("/direct", "Connection: close\r\n"))
            assert out.count(b"HTTP/1.1 200") == 1 and out.endswith(b"direct /direct")
            out = await talk(port, get("/direct-close") + get("/h"))  # the answer asks to close
            assert out.count(b"HTTP/1.1 200") == 1 and b"Connection: close" in out
            out = await talk(port, get("/direct"), half_close=True)  # the peer is gone: answered, closed
            assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"direct /direct")

    run(go(), 60)


def test_a_big_started_answer_waits_for_its_write_before_the_next() -> None:
    async def go() -> None:
        start = _Starter()
        async with _server(start) as (port, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(get("/direct-big") + get("/h") + get("/direct?after"))
                await asyncio.sleep(0.2)  # unread: the server's writes pause
                got = await answers(reader, 3)
                assert [len(body) for _, body in got] == [
                    8 << 20,
                    len(b"handler /h 0"),
                    len(b"handler /direct?after 0"),
                ]
                assert [t for t, _, _ in start.sent] == ["/direct-big"]
            finally:
                writer.close()

    run(go(), 60)


def test_a_start_that_fails_leaves_the_request_to_the_handler() -> None:
    async def go() -> None:
        async with _server(_Starter(fail=True)) as (port, _):
            out = await talk(port, get("/direct", "Connection: close\r\n"))
            assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"handler /direct 0")

    run(go(), 60)


def test_closing_a_connection_waits_for_its_started_answer() -> None:
    async def go() -> None:
        async with _server(_Starter(delay=0.1)) as (port, wires):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(get("/direct"))
                await asyncio.sleep(0.03)
                for wire in list(wires):
                    wire.close()  # as the door stops: the answer being made still goes out
                out = await asyncio.wait_for(reader.read(-1), DEADLINE_S)
                assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"direct /direct")
            finally:
                writer.close()

    run(go(), 60)
