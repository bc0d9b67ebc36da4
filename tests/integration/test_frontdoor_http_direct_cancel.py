"""A direct HTTP request (``http_direct``: sent without a coroutine) whose reply does not come within the
door's wait is answered as the usual path answers a timed-out request, and is cancelled in the broker: the
door sends CANCEL naming the INFER it sent, seen on the wire between the door and a real ``zinfer serve``."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import start_server, stop_all
from tests.gated import gated_model
from tests.wire_spy import WireSpy
from zinfer.frontdoor.bridge import Bridge
from zinfer.frontdoor.door import FrontDoor, FrontDoorOptions
from zinfer.frontdoor.http_messages import HttpRequest, HttpResponse
from zinfer.frontdoor.http_server import HttpFrontDoor
from zinfer.frontdoor.sysshm import SystemShm

pytestmark = pytest.mark.integration

WAIT_S = 0.5  # the door's wait for the broker (a request without its own timeout waits this long)
HEADER = json.dumps(
    {
        "inputs": [
            {"name": "INPUT_A", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
            {"name": "INPUT_B", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
        ],
        "outputs": [{"name": "OUTPUT_SUM", "parameters": {"binary_data": True}}],
    },
    separators=(",", ":"),
).encode()


def _request(tag: int) -> HttpRequest:
    body = HEADER + struct.pack("<2f", tag, 0.5)
    headers = {"inference-header-content-length": str(len(HEADER)), "content-length": str(len(body))}
    return HttpRequest("POST", "/v2/models/gated/infer", headers, body, ("127.0.0.1", 1), None, 11, 12)


async def _started(handler: HttpFrontDoor, request: HttpRequest) -> HttpResponse | None:
    answered: asyncio.Future[HttpResponse] = asyncio.get_running_loop().create_future()
    if not handler.start(request, answered.set_result):
        return None
    return await asyncio.wait_for(answered, 30)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait, without blocking the loop, until ``condition`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_a_timed_out_direct_request_is_cancelled_in_the_broker(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    gate = gated_model(repo, "gated", max_batch_size=8, count=2)
    server = start_server(repo)
    try:
        with WireSpy(server.url) as spy:

            async def body() -> None:
                shm = tmp_path / "shm"
                bridge = Bridge(spy.url, timeout=WAIT_S)
                door = FrontDoor(FrontDoorOptions(spy.url, shm), bridge, SystemShm(shm))
                try:
                    handler = HttpFrontDoor(door)
                    gate.release(1)
                    first = await handler.handle(_request(1))  # the usual way: makes the direct plan
                    assert first.status == 200, first
                    assert spy.cancelled == []

                    # the direct way, held in the model past the door's wait
                    got = await _started(handler, _request(7))
                    assert got is not None, "the request did not go the direct way"
                    assert gate.started(7) and not gate.done(7)  # it timed out while the model held it
                    assert [r.model for r in spy.sent] == ["gated", "gated"]
                    direct_id = spy.sent[-1].request_id
                    await _until(lambda: direct_id in spy.cancelled, "the door to cancel the request")
                    assert spy.cancelled == [direct_id]

                    # answered as the usual path answers the same timeout, byte for byte
                    usual = await HttpFrontDoor(door).handle(_request(8))
                    assert got.status >= 400 and (got.status, bytes(got.body[0])) == (
                        usual.status, bytes(usual.body[0]),
                    )  # fmt: skip
                    await _until(lambda: len(spy.cancelled) == 2, "the usual path to cancel too")

                    # the door goes on: a released request goes the direct way again, answered in full
                    gate.release_all()
                    again = await _started(handler, _request(2))
                    assert again is not None and again.status == 200
                    assert bytes(again.body[1]) == struct.pack("<f", 2.5)
                    assert len(spy.cancelled) == 2
                finally:
                    await door.bridge.close()

            asyncio.run(body())
    finally:
        gate.release_all()
        stop_all([server])
