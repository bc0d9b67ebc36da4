"""The HTTP door's direct path (``http_raw``, ``http_direct``): a request whose header, model and version were
answered before goes to the broker as its body's byte ranges, and the reply's frames become the answer. Its
answers and errors are those of the usual path, byte for byte: each request's answer is compared with the
answer of a fresh handler (no kept headers, no plans: the usual path) to the same request, against a real
``zinfer serve`` through the door's own handler in this process."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import repository
from zinfer.client import AsyncClient
from zinfer.frontdoor.bridge import Bridge
from zinfer.frontdoor.door import FrontDoor, FrontDoorOptions
from zinfer.frontdoor.http_server import HttpFrontDoor
from zinfer.frontdoor.http_wire import HttpRequest, HttpResponse
from zinfer.frontdoor.sysshm import SystemShm

pytestmark = pytest.mark.integration

HEADER = json.dumps(
    {
        "inputs": [
            {"name": "INPUT_A", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            {"name": "INPUT_B", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        ],
        "outputs": [{"name": "OUTPUT_SUM", "parameters": {"binary_data": True}}],
    },
    separators=(",", ":"),
).encode()
JSON_OUT = HEADER.replace(b'"binary_data":true', b'"binary_data":false')


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("fdd")
    trace = root / "trace.json"
    server = start_server(
        repository(root, ("add", "identity")), "--model-control-mode", "explicit", "--load-model", "*",
        "--trace-config", f"triton,file={trace}", "--trace-config", "level=OFF",
    )  # fmt: skip
    try:
        yield server, root
    finally:
        stop_all([server])


def _request(
    header: bytes, *values: float, extra: bytes = b"", traceparent: str = "", model: str = "add"
) -> HttpRequest:
    body = header + struct.pack(f"<{len(values)}f", *values) + extra
    headers = {"inference-header-content-length": str(len(header)), "content-length": str(len(body))}
    if traceparent:
        headers["traceparent"] = traceparent
    return HttpRequest("POST", f"/v2/models/{model}/infer", headers, body, ("127.0.0.1", 1), None, 11, 12)


def _identity(n: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                     "parameters": {"binary_data_size": 4 * n}}],
         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
        separators=(",", ":"),
    ).encode()  # fmt: skip


def _shown(r: HttpResponse) -> tuple[Any, ...]:
    """What a response writes (its head as written ahead or as made, and its body's bytes)."""
    head = r.written if r.written is not None else r.head(True)
    return r.status, head, b"".join(bytes(p) for p in r.body), r.content_type, dict(r.headers), r.close


def _door(server: ServerProcess, root: Path) -> FrontDoor:
    return FrontDoor(FrontDoorOptions(server.url, root / "shm"), Bridge(server.url), SystemShm(root / "shm"))


def _run(server: ServerProcess, root: Path, body: Any) -> Any:
    async def main() -> Any:
        door = _door(server, root)
        try:
            return await body(door)
        finally:
            await door.bridge.close()

    return asyncio.run(main())


def test_direct_answers_are_the_usual_answers(broker: tuple[ServerProcess, Path]) -> None:
    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for header in (HEADER, JSON_OUT):
            for i in range(6):
                request = _request(header, i, 2.5, -i, 0.25 * i)
                got = await handler.handle(request)
                usual = await HttpFrontDoor(door).handle(request)  # fresh tables: the usual path
                assert _shown(got) == _shown(usual), (header, i)
                assert got.status == 200
            known = handler.requests.header(request.body, len(header))
            assert known is not None
            plan = known.plans[("add", "")]
            assert plan is not None  # went direct
            assert (plan.reply is not None) == (header is HEADER)  # JSON data: read the usual way
        sums = await handler.handle(_request(HEADER, 1, 2, 3, 4))
        assert bytes(sums.body[1]) == struct.pack("<2f", 4, 6)

    _run(*broker, body)


def test_requests_through_the_arena_go_the_usual_way(broker: tuple[ServerProcess, Path]) -> None:
    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for n, direct in ((4, True), (2048, False)):  # 8 KiB in and out: over the inline threshold
            header = _identity(n)
            for i in range(4):
                request = _request(header, *[float(i + k) for k in range(n)], model="identity")
                got = await handler.handle(request)
                usual = await HttpFrontDoor(door).handle(request)
                assert got.status == 200 and _shown(got) == _shown(usual), (n, i)
                assert bytes(got.body[1]) == request.body[len(header) :]
            known = handler.requests.header(request.body, len(header))
            assert known is not None and known.plans[("identity", "")].direct is direct

    _run(*broker, body)


def test_direct_errors_are_the_usual_errors(broker: tuple[ServerProcess, Path]) -> None:
    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for _ in range(3):
            assert (await handler.handle(_request(HEADER, 1, 2, 3, 4))).status == 200
        for bad in (_request(HEADER, 1, 2, 3), _request(HEADER, 1, 2, 3, 4, extra=b"\x00")):
            got = await handler.handle(bad)
            usual = await HttpFrontDoor(door).handle(bad)
            assert got.status == 400 and _shown(got) == _shown(usual)
        assert (await handler.handle(_request(HEADER, 1, 2, 3, 4))).status == 200

    _run(*broker, body)


def test_a_reload_makes_a_new_plan(broker: tuple[ServerProcess, Path]) -> None:
    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for _ in range(3):
            await handler.handle(_request(HEADER, 1, 2, 3, 4))
        known = handler.requests.header(_request(HEADER).body + b"\x00" * 16, len(HEADER))
        assert known is not None
        first = known.plans[("add", "")]
        await door.bridge.load("add")  # the client forgets the model's information
        for i in range(3):
            got = await handler.handle(_request(HEADER, i, 1, 1, 1))
            assert got.status == 200 and bytes(got.body[1]) == struct.pack("<2f", i + 1, 2)
        assert known.plans[("add", "")] not in (None, first)

    _run(*broker, body)


def test_traced_direct_requests_stamp_their_trace(broker: tuple[ServerProcess, Path]) -> None:
    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for _ in range(3):  # untraced: planned, and its reply's kind kept
            got = await handler.handle(_request(HEADER, 1, 2, 3, 4))
            assert got.on_sent is None
        await door.bridge.trace_settings("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        try:
            for _ in range(2):
                got = await handler.handle(_request(HEADER, 1, 2, 3, 4))
                usual = await HttpFrontDoor(door).handle(_request(HEADER, 1, 2, 3, 4))
                assert got.on_sent is not None and usual.on_sent is not None
                assert _shown(got)[2] == _shown(usual)[2]
            # a traceparent goes the usual way (its parameter reaches the model)
            parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            assert (await handler.handle(_request(HEADER, 1, 2, 3, 4, traceparent=parent))).status == 200
        finally:
            await door.bridge.trace_settings("", {"trace_level": ["OFF"]})

    _run(*broker, body)


async def _started(handler: HttpFrontDoor, request: HttpRequest) -> HttpResponse | None:
    """``handler.start``'s answer to ``request`` (None: it did not take it)."""
    answered: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
    if not handler.start(request, answered.set_result):
        return None
    return await asyncio.wait_for(answered, 10)


def test_started_answers_are_the_usual_answers(broker: tuple[ServerProcess, Path]) -> None:
    """``HttpFrontDoor.start`` (no coroutine: what ``HttpWire`` asks first) takes a request only once its
    header has a plan that goes direct, and answers as ``handle`` does, byte for byte, errors included."""

    async def body(door: FrontDoor) -> None:
        handler = HttpFrontDoor(door)
        for header in (HEADER, JSON_OUT):
            first = _request(header, 1, 2, 3, 4)
            assert await _started(handler, first) is None  # nothing planned yet
            assert (await handler.handle(first)).status == 200
            for i in range(4):
                request = _request(header, i, 2.5, -i, 0.25 * i)
                ok = door.counters.counts["http"]["ok"]
                got = await _started(handler, request)
                assert got is not None, (header, i)
                assert door.counters.counts["http"]["ok"] == ok + 1  # counted as ``handle`` counts
                usual = await HttpFrontDoor(door).handle(request)
                assert _shown(got) == _shown(usual), (header, i)
        # what ``handle`` refuses, ``start`` leaves to it: bad sizes, a traceparent, other routes, GETs
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        for other in (
            _request(HEADER, 1, 2, 3),
            _request(HEADER, 1, 2, 3, 4, extra=b"\x00"),
            _request(HEADER, 1, 2, 3, 4, traceparent=parent),
            _request(HEADER, 1, 2, 3, 4, model="identity"),
            _request(HEADER, 1, 2, 3, 4)._replace(method="GET"),
            _request(HEADER, 1, 2, 3, 4)._replace(headers={"inference-header-content-length": "x"}),
        ):
            assert await _started(handler, other) is None
        # an error the broker answers is answered as ``handle`` answers it: the model unloaded behind the
        # door's back (by another client: the door still holds its information, so the plan holds)
        other = AsyncClient(door.options.broker_url)
        try:
            await other.unload_model("add")
            request = _request(HEADER, 1, 2, 3, 4)
            ok, failed = door.counters.counts["http"]["ok"], door.counters.counts["http"].get("failed", 0)
            got = await _started(handler, request)
            assert got is not None and got.status >= 400
            assert door.counters.counts["http"] == {"ok": ok, "failed": failed + 1}
            usual = await handler.handle(request)
            assert _shown(got) == _shown(usual)
        finally:
            await other.load_model("add")
            await other.close()

    _run(*broker, body)
