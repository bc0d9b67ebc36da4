"""Decoupled models over a real server: several responses per request, sync and async, the last final."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, start_server
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


GATED_STREAM = """
import os
import time

import numpy as np

GATE = os.path.join(os.path.dirname(__file__), "gate")


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        for i, word in enumerate(bytes(inputs["TEXT"][0]).split()):
            if word == b"boom":
                raise RuntimeError("the model failed mid-stream")
            deadline = time.monotonic() + 60
            while i and not os.path.exists(os.path.join(GATE, str(i))) and time.monotonic() < deadline:
                time.sleep(0.002)  # word i waits until the test has received word i - 1
            yield {"TOKEN": np.array([word], dtype=object)}
"""


@pytest.fixture(scope="module")
def gated_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """``gated_stream``: token_stream whose word i is produced only once the test creates ``gate/i``."""
    repo = tmp_path_factory.mktemp("stream")
    shutil.copytree(MODELS / "token_stream", repo / "gated_stream")
    cfg = (repo / "gated_stream" / "config.pbtxt").read_text().replace("token_stream", "gated_stream")
    (repo / "gated_stream" / "config.pbtxt").write_text(cfg)
    (repo / "gated_stream" / "1" / "model.py").write_text(GATED_STREAM)
    gate = repo / "gated_stream" / "1" / "gate"
    gate.mkdir()
    s = start_server(repo)
    try:
        yield s, gate
    finally:
        for i in range(10):
            (gate / str(i)).touch()
        assert s.stop() == 0, s.log()


def test_each_response_leaves_as_soon_as_it_is_made(gated_stream: tuple[ServerProcess, Path]) -> None:
    """Word i + 1 is not produced until word i has reached the client: a server or client that held the
    responses back (until the end, or until a batch of them) would never deliver word 1, and this test
    would time out on it."""
    server, gate = gated_stream
    for p in gate.iterdir():
        p.unlink()
    words = [b"alpha", b"beta", b"gamma"]
    with Client(server.url, timeout=30) as c:
        text = np.array([b" ".join(words)], dtype=object)
        stream = c.stream("gated_stream", {"TEXT": text}, client_timeout=20)
        got = []
        for i, r in enumerate(stream):
            if r.final:
                break
            got.append(bytes(r.as_numpy("TOKEN")[0]))
            assert not (gate / str(i + 1)).exists()  # received before the model may make the next one
            (gate / str(i + 1)).touch()
        assert got == words
        assert next(stream, None) is None  # the final response was the last


def test_an_error_mid_stream_reaches_the_caller_after_the_responses_before_it(
    gated_stream: tuple[ServerProcess, Path],
) -> None:
    server, gate = gated_stream
    for i in range(10):
        (gate / str(i)).touch()
    with Client(server.url, timeout=30) as c:
        got = []
        with pytest.raises(ServerError, match="mid-stream"):
            for r in c.stream("gated_stream", {"TEXT": np.array([b"one two boom three"], dtype=object)}):
                if not r.final:
                    got.append(bytes(r.as_numpy("TOKEN")[0]))
        assert got == [b"one", b"two"]
        assert len(list(c.stream("gated_stream", {"TEXT": np.array([b"still here"], dtype=object)}))) == 3
