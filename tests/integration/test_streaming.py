"""Decoupled models over a real server: several responses per request, sync and async, the last final."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import ServerProcess
from zinfer.client import AsyncClient, Client
from zinfer.client.errors import ServerError

pytestmark = pytest.mark.integration

TEXT = np.array([b"one two three four five"], dtype=object)


def test_sync_stream_yields_each_token_then_final(bundled_server: ServerProcess) -> None:
    with Client(bundled_server.url, timeout=30) as c:
        results = list(c.stream("token_stream", {"TEXT": TEXT}))
        tokens = [bytes(r.as_numpy("TOKEN")[0]) for r in results if not r.final]
        assert tokens == [b"one", b"two", b"three", b"four", b"five"]
        assert results[-1].final and sum(r.final for r in results) == 1
        # a plain request on the same client still works, and so does a second stream
        assert len(list(c.stream("token_stream", {"TEXT": np.array([b"x y"], dtype=object)}))) == 3
        ab = {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.ones((1, 1), np.float32)}
        assert c.infer("add", ab).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_async_streams_interleave(bundled_server: ServerProcess) -> None:
    async def main() -> list[list[bytes]]:
        async with AsyncClient(bundled_server.url, timeout=30) as c:

            async def words(text: bytes) -> list[bytes]:
                out = []
                async for r in c.stream("token_stream", {"TEXT": np.array([text], dtype=object)}):
                    if not r.final:
                        out.append(bytes(r.as_numpy("TOKEN")[0]))
                return out

            return await asyncio.gather(*(words(f"a{i} b{i} c{i}".encode()) for i in range(20)))

    for i, got in enumerate(asyncio.run(main())):
        assert got == [f"a{i}".encode(), f"b{i}".encode(), f"c{i}".encode()]


def test_stream_error_reaches_the_caller(bundled_server: ServerProcess) -> None:
    with Client(bundled_server.url, timeout=30) as c:
        with pytest.raises(ServerError):
            list(c.stream("token_stream", {"TEXT": np.array([[b"wrong", b"shape"]], dtype=object)}))
