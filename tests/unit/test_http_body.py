"""The HTTP door's request body reader (``frontdoor.http_server.HttpFrontDoor._body``): a body that has
arrived in full is read at once; one that stops arriving is refused after ``BODY_TIMEOUT_S`` (a client that
sends headers and then trickles or stalls never holds a handler forever); one shorter than declared is
refused with the count."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from aiohttp import streams
from aiohttp.test_utils import make_mocked_request

from zinfer.frontdoor import http_server


def _request(loop: asyncio.AbstractEventLoop, declared: int, body: bytes, eof: bool) -> Any:
    protocol = mock.Mock(_reading_paused=False)
    payload = streams.StreamReader(protocol, 2**16, loop=loop)
    if body:
        payload.feed_data(body)
    if eof:
        payload.feed_eof()
    return make_mocked_request(
        "POST", "/v2/models/m/infer", headers={"Content-Length": str(declared)}, payload=payload
    )


def _read(declared: int, body: bytes, eof: bool, timeout_s: float, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(http_server, "BODY_TIMEOUT_S", timeout_s)

    async def run() -> bytes:
        request = _request(asyncio.get_running_loop(), declared, body, eof)
        door = http_server.HttpFrontDoor.__new__(http_server.HttpFrontDoor)
        return await door._body(request, 1 << 20)

    return asyncio.run(asyncio.wait_for(run(), 10))


def test_a_body_that_arrived_in_full_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _read(5, b"hello", True, 0.2, monkeypatch) == b"hello"


def test_a_stalled_body_is_refused_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(http_server._BodyRefused, match="did not arrive within 0.2 s"):
        _read(10, b"half", False, 0.2, monkeypatch)


def test_a_body_shorter_than_declared_is_refused_with_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(http_server._BodyRefused, match="ended after 4 of 10 bytes"):
        _read(10, b"half", True, 5.0, monkeypatch)
