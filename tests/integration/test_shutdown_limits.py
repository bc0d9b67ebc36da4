"""Limits that only show when they run out: the drain timeout, a second signal, the exit timeout, and the
crash limit that fails a model. Each waits on a condition with a deadline far below the limit it checks."""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from tests.gated import Gate, gated_model
from zinfer.client import Client
from zinfer.client.errors import ConnectionFailed, Unavailable, ZinferError

pytestmark = pytest.mark.integration


def _ab(v: float) -> dict[str, np.ndarray]:
    a = np.full((1, 1), v, np.float32)
    return {"INPUT_A": a, "INPUT_B": a}


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Gate]:
    gate = gated_model(tmp_path, "g")
    yield gate
    gate.release_all()


def _hold_a_batch(server: ServerProcess, gate: Gate, out: list[object]) -> threading.Thread:
    """A request whose batch runs (and stays running) on the gated model; its outcome goes to ``out``."""

    def call() -> None:
        try:
            with Client(server.url, timeout=60) as c:
                out.append(c.infer("g", _ab(1)))
        except ZinferError as exc:
            out.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    gate.wait_started(1)
    return t


def _exits(server: ServerProcess, within: float, what: str) -> int:
    wait_for(lambda: server.proc.poll() is not None, within, what)
    return int(server.proc.returncode)


def _no_workers_left(workers: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)


def test_the_drain_timeout_runs_out_on_a_batch_that_never_ends(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, held: Gate
) -> None:
    """SIGTERM with a batch that will not finish: after --drain-timeout (1 s) the server stops anyway, the
    running request gets an error and the stuck worker is gone. The deadline (30 s) is far below the
    model's own 120 s, so a server waiting for the batch fails this test."""
    server = server_factory(tmp_path, "--drain-timeout", "1", "--exit-timeout", "1")
    out: list[object] = []
    t = _hold_a_batch(server, held, out)
    workers = server.workers()
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "event=draining" in server.log(), 10, "the server to start draining")
    code = _exits(server, 30, "the drain timeout to end the server")
    assert code == 0, server.log()
    assert not held.done(1)  # it never finished: the timeouts ended it
    wait_for(lambda: _no_workers_left(workers), 10, "the stuck worker to be killed")
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], (Unavailable, ConnectionFailed)), out


def test_a_second_signal_stops_at_once(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, held: Gate
) -> None:
    """While draining (a 600 s drain timeout, a batch held), a second SIGTERM stops the server now."""
    server = server_factory(tmp_path, "--drain-timeout", "600", "--exit-timeout", "1")
    out: list[object] = []
    t = _hold_a_batch(server, held, out)
    workers = server.workers()
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "event=draining" in server.log(), 10, "the server to start draining")
    with Client(server.url, timeout=10) as c:  # still draining: the first signal alone does not stop it
        with pytest.raises(Unavailable):
            c.infer("g", _ab(2))
    assert server.proc.poll() is None
    server.proc.send_signal(signal.SIGTERM)
    _exits(server, 30, "the second signal to stop the server")
    assert not held.done(1)
    wait_for(lambda: _no_workers_left(workers), 10, "the stuck worker to be killed")
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], (Unavailable, ConnectionFailed)), out


def test_the_exit_timeout_kills_a_worker_that_does_not_stop(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, held: Gate
) -> None:
    """A frozen worker (SIGSTOP) cannot obey SHUTDOWN: after --exit-timeout (1 s) the server signals it,
    then kills it, and exits; nothing is left running."""
    server = server_factory(tmp_path, "--drain-timeout", "1", "--exit-timeout", "1")
    out: list[object] = []
    t = _hold_a_batch(server, held, out)
    workers = server.workers()
    frozen = [p for p in workers if "--model g" in " ".join(p.cmdline())]
    assert len(frozen) == 1
    frozen[0].suspend()
    try:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.send_signal(signal.SIGTERM)
        _exits(server, 30, "the exit timeout to end the frozen worker and the server")
        wait_for(lambda: _no_workers_left(workers), 10, "every worker to be gone")
    finally:
        if frozen[0].is_running():
            frozen[0].kill()
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], (Unavailable, ConnectionFailed)), out


CRASHES_SOON_AFTER_READY = """
import os
import threading


class Model:
    def initialize(self, config):
        threading.Timer(1.0, os._exit, (3,)).start()  # ready first, then the process dies

    def execute(self, inputs):
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""


def test_a_model_whose_worker_keeps_crashing_is_failed(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A worker that dies a second after every start is restarted with backoff (0.5, 1, 2, 4, 8 s) and, at
    the sixth exit within a minute, not again: the model is UNAVAILABLE with the reason; others serve."""
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    shutil.copytree(MODELS / "add", repo / "crashy")
    cfg = (repo / "crashy" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "crashy"').replace('backend: "zinfer"', 'backend: "python"')
    cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', "")
    (repo / "crashy" / "config.pbtxt").write_text(cfg)
    (repo / "crashy" / "1" / "model.py").write_text(CRASHES_SOON_AFTER_READY)
    server = server_factory(repo, wait_ready=False)
    with Client(server.url, timeout=30) as c:

        def failed() -> bool:
            row = next((r for r in c.repository_index() if r["name"] == "crashy"), None)
            return row is not None and row["state"] == "UNAVAILABLE" and "crashed" in row.get("reason", "")

        wait_for(lambda: "event=http_listening" in server.log(), 60, "the server to start")
        wait_for(failed, 90, "the crash limit to fail the model")
        reason = next(r for r in c.repository_index() if r["name"] == "crashy")["reason"]
        assert "crashed 5 times in a minute" in reason
        assert server.log().count("event=worker_exited model=crashy") == 6
        assert not any("--model crashy" in line for line in server.worker_cmdlines())  # not restarted again
        one = np.ones((1, 1), np.float32)
        assert c.infer("add", {"INPUT_A": one, "INPUT_B": one}).as_numpy("OUTPUT_SUM")[0, 0] == 2.0
