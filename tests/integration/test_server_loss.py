"""A server that dies or freezes: waiting calls fail with ``ConnectionFailed`` within about two heartbeat
intervals (ZMTP heartbeats and the socket monitor, ``client/link_watch.py``), not after their timeout; the
same client then works with a new server on the same runtime directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from tests.frontdoor_helpers import free_port
from zinfer.client import AsyncClient, Client
from zinfer.client.connection import Unsent
from zinfer.client.errors import ConnectionFailed

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)
PROMPT_S = 3.0  # two heartbeat intervals of 1 s, and some slack for a loaded machine
SLOW_S = 30.0  # how long the slow models take: far beyond PROMPT_S, within the clients' timeout

SLOW_ADD = """
import pathlib
import time

HERE = pathlib.Path(__file__).parent


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        (HERE / "started").touch()
        time.sleep(float((HERE / "delay").read_text()))
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""

SLOW_STREAM = """
import pathlib
import time

import numpy as np

HERE = pathlib.Path(__file__).parent


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        yield {"TOKEN": np.array([b"first"], dtype=object)}
        time.sleep(float((HERE / "delay").read_text()))
        yield {"TOKEN": np.array([b"second"], dtype=object)}
"""


def _repo(root: Path) -> Path:
    """``slow`` (add, taking ``delay`` seconds, touching ``started`` when it begins) and ``slow_stream``
    (a decoupled model that answers once, then waits ``delay`` seconds before its next response)."""
    repo = root / "models"
    shutil.copytree(MODELS / "add", repo / "slow")
    cfg = (repo / "slow" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "slow"').replace('backend: "zinfer"', 'backend: "python"')
    cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', "")
    (repo / "slow" / "config.pbtxt").write_text(cfg)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_ADD)
    shutil.copytree(MODELS / "token_stream", repo / "slow_stream")
    cfg = (repo / "slow_stream" / "config.pbtxt").read_text()
    cfg = cfg.replace('"token_stream"', '"slow_stream"').replace("count: 1", "count: 2")  # a stream each
    (repo / "slow_stream" / "config.pbtxt").write_text(cfg)
    (repo / "slow_stream" / "1" / "model.py").write_text(SLOW_STREAM)
    _set_delay(repo, SLOW_S)
    return repo


def _set_delay(repo: Path, seconds: float) -> None:
    for model in ("slow", "slow_stream"):
        (repo / model / "1" / "delay").write_text(str(seconds))


def _started(repo: Path) -> Path:
    return repo / "slow" / "1" / "started"


async def _until_started(repo: Path, waiting: asyncio.Future[float], timeout: float = 30.0) -> None:
    """Wait (without blocking the loop) until the call ``waiting`` made has reached the model."""
    deadline = time.monotonic() + timeout
    while not _started(repo).exists():
        assert not waiting.done(), waiting
        assert time.monotonic() < deadline, f"the request did not reach the model within {timeout} s"
        await asyncio.sleep(0.02)


@pytest.fixture
def hard_stops() -> Iterator[Callable[[ServerProcess], list[psutil.Process]]]:
    """``stop(server)``: SIGKILL a server (resumed first if it was stopped) and its workers; whatever a
    test stopped is killed at its end anyway."""
    stopped: list[tuple[ServerProcess, list[psutil.Process]]] = []

    def stop(server: ServerProcess) -> list[psutil.Process]:
        workers = server.workers()
        stopped.append((server, workers))
        return workers

    yield stop
    for server, workers in stopped:
        _kill(server, workers)


def _kill(server: ServerProcess, workers: list[psutil.Process]) -> None:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    for p in workers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=10)


def _add(client: Client, model: str = "slow") -> float:
    return float(client.infer(model, {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0])


async def _aadd(client: AsyncClient, model: str = "slow") -> float:
    result = await client.infer(model, {"INPUT_A": ONE, "INPUT_B": ONE})
    return float(result.as_numpy("OUTPUT_SUM")[0, 0])


def _restart(server_factory: Callable[..., ServerProcess], first: ServerProcess, repo: Path) -> ServerProcess:
    """A new server on ``first``'s runtime directory, with models that answer at once."""
    _set_delay(repo, 0)
    return server_factory(repo, runtime_dir=first.runtime_dir.parent)


def test_killed_server_fails_a_waiting_infer_promptly(
    server_factory: Callable[..., ServerProcess],
    hard_stops: Callable[[ServerProcess], list[psutil.Process]],
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo)
    with Client(server.url, timeout=SLOW_S * 2, inline_threshold=-1) as client:
        client.model_metadata("slow")
        killed_at: list[float] = []

        def kill_once_running() -> None:
            wait_for(_started(repo).exists, 30, "the request to reach the model")
            workers = hard_stops(server)
            killed_at.append(time.monotonic())
            server.proc.kill()
            _kill(server, workers)

        killer = threading.Thread(target=kill_once_running)
        killer.start()
        try:
            with pytest.raises(ConnectionFailed, match="lost the connection"):
                _add(client)
        finally:
            killer.join()
        assert time.monotonic() - killed_at[0] < PROMPT_S
        _restart(server_factory, server, repo)
        assert _add(client) == 2.0  # its shared memory registered anew with the new server


def test_killed_server_fails_a_waiting_async_infer_promptly(
    server_factory: Callable[..., ServerProcess],
    hard_stops: Callable[[ServerProcess], list[psutil.Process]],
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo)

    async def main() -> None:
        async with AsyncClient(server.url, timeout=SLOW_S * 2, inline_threshold=-1) as client:
            waiting = asyncio.ensure_future(_aadd(client))
            await _until_started(repo, waiting)
            workers = hard_stops(server)
            killed_at = time.monotonic()
            server.proc.kill()
            with pytest.raises(ConnectionFailed, match="lost the connection"):
                await asyncio.wait_for(waiting, SLOW_S)
            assert time.monotonic() - killed_at < PROMPT_S
            _kill(server, workers)
            _restart(server_factory, server, repo)
            assert await _aadd(client) == 2.0

    asyncio.run(main())


def test_killed_server_fails_open_streams_promptly(
    server_factory: Callable[..., ServerProcess],
    hard_stops: Callable[[ServerProcess], list[psutil.Process]],
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    server = server_factory(repo)
    text = {"TEXT": np.array([b"a b"], dtype=object)}

    async def main() -> None:
        with Client(server.url, timeout=SLOW_S * 2) as client:
            async with AsyncClient(server.url, timeout=SLOW_S * 2) as aclient:
                sync_stream = client.stream("slow_stream", text)
                async_stream = aclient.stream("slow_stream", text)
                assert next(sync_stream).as_numpy("TOKEN")[0] == b"first"
                assert (await async_stream.__anext__()).as_numpy("TOKEN")[0] == b"first"
                workers = hard_stops(server)
                killed_at = time.monotonic()
                server.proc.kill()
                with pytest.raises(ConnectionFailed, match="lost the connection"):
                    next(sync_stream)
                with pytest.raises(ConnectionFailed, match="lost the connection"):
                    await asyncio.wait_for(async_stream.__anext__(), SLOW_S)
                assert time.monotonic() - killed_at < PROMPT_S
                _kill(server, workers)
                _restart(server_factory, server, repo)
                assert [r.final for r in client.stream("slow_stream", text)] == [False, False, True]
                assert [r.final async for r in aclient.stream("slow_stream", text)] == [False, False, True]

    asyncio.run(main())


def test_frozen_server_is_noticed_by_heartbeats(
    server_factory: Callable[..., ServerProcess],
    hard_stops: Callable[[ServerProcess], list[psutil.Process]],
    tmp_path: Path,
) -> None:
    """SIGSTOP keeps the server's socket and connections open: only the heartbeats can tell. A call
    made while it is frozen fails as promptly (nothing is queued for a later server)."""
    repo = _repo(tmp_path)
    server = server_factory(repo)

    async def main() -> None:
        with Client(server.url, timeout=SLOW_S * 2, inline_threshold=-1) as client:
            async with AsyncClient(server.url, timeout=SLOW_S * 2, inline_threshold=-1) as aclient:
                client.model_metadata("slow")
                await aclient.model_metadata("slow")
                waiting = asyncio.ensure_future(_aadd(aclient))
                await _until_started(repo, waiting)
                workers = hard_stops(server)
                os.kill(server.proc.pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                with pytest.raises(ConnectionFailed, match="lost the connection"):
                    await asyncio.to_thread(_add, client)
                with pytest.raises(ConnectionFailed, match="lost the connection"):
                    await asyncio.wait_for(waiting, SLOW_S)
                assert time.monotonic() - stopped_at < PROMPT_S
                start = time.monotonic()
                with pytest.raises(ConnectionFailed):
                    client.is_server_live()
                with pytest.raises(ConnectionFailed):
                    await aclient.is_server_live()
                assert time.monotonic() - start < 2 * PROMPT_S
                _kill(server, workers)
                _restart(server_factory, server, repo)
                assert _add(client) == 2.0
                assert await _aadd(aclient) == 2.0

    asyncio.run(main())


@pytest.mark.parametrize("timeout", [0.5, 1.0, 2.0])
def test_a_call_no_server_ever_took_fails_as_unsent_not_as_a_timeout(timeout: float) -> None:
    """The call's timeout may be the same as its connect wait (min(timeout, 2 heartbeats)): a message that
    never left is ``Unsent`` (the server never saw it), never a ``RequestTimeout``. With a 1 s timeout and
    the 1 s heartbeat both deadlines fell on the same instant and the sync client said timeout."""
    url = f"tcp://127.0.0.1:{free_port()}"
    with Client(url, timeout=timeout) as client:
        with pytest.raises(Unsent, match="no connection"):
            client.is_server_live()

    async def main() -> None:
        async with AsyncClient(url, timeout=timeout) as aclient:
            with pytest.raises(Unsent, match="no connection"):
                await aclient.is_server_live()

    asyncio.run(main())
