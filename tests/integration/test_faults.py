"""Faults from the reliability scenario table (docs/reliability.md): each test is named for its row."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for, zinfer_segments
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument, Unavailable

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)

SLOW_ADD = """
import time


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        time.sleep(float(open(__file__.replace("model.py", "delay")).read()))
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""


def _slow_repo(tmp_path: Path, delay_s: float) -> Path:
    """``slow``: an add model in Python that takes ``delay_s`` a batch (read from a file each time)."""
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "slow")
    cfg = (repo / "slow" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "slow"').replace('backend: "zinfer"', 'backend: "python"')
    cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', "")
    (repo / "slow" / "config.pbtxt").write_text(cfg)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_ADD)
    (repo / "slow" / "1" / "delay").write_text(str(delay_s))
    return repo


def _worker(server: ServerProcess, model: str) -> int:
    for p in server.workers():
        try:
            if f"--model {model}" in " ".join(p.cmdline()):
                return int(p.pid)
        except Exception:
            continue
    raise AssertionError(f"no worker for {model}")


def test_scenario_01_worker_killed_mid_batch(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Every request of the batch gets an explicit error, the instance restarts, the next request works."""
    server = server_factory(_slow_repo(tmp_path, 2.0))
    results: list[object] = []
    with Client(server.url, timeout=30) as client:
        client._model_info("slow", 0)

        def call() -> None:
            try:
                results.append(client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}))
            except Exception as exc:
                results.append(exc)

        t = threading.Thread(target=call)
        t.start()
        wait_for(
            lambda: client.statistics("slow")["model_stats"][0]["execution_count"] == 1,
            10,
            "the batch to run",
        )
        victim = _worker(server, "slow")
        os.kill(victim, signal.SIGKILL)
        t.join(10)
        assert len(results) == 1 and isinstance(results[0], Unavailable), results
        assert "worker exited" in str(results[0])
        (tmp_path / "models" / "slow" / "1" / "delay").write_text("0")
        wait_for(lambda: client.is_model_ready("slow"), 30, "the restarted instance", interval=0.1)
        assert client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_02_hung_worker_is_replaced(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A worker frozen mid-batch (SIGSTOP) stops heartbeating: after 5 intervals it is killed, its request
    fails with Unavailable, and a new instance serves."""
    server = server_factory(_slow_repo(tmp_path, 0.5))
    results: list[object] = []
    with Client(server.url, timeout=30) as client:
        client._model_info("slow", 0)
        ab = {"INPUT_A": ONE, "INPUT_B": ONE}
        t = threading.Thread(target=lambda: results.append(_try(lambda: client.infer("slow", ab))))
        t.start()
        wait_for(lambda: client.statistics("slow")["model_stats"][0]["execution_count"] == 1, 10, "the batch")
        frozen = _worker(server, "slow")
        os.kill(frozen, signal.SIGSTOP)
        start = time.monotonic()
        t.join(20)
        assert len(results) == 1 and isinstance(results[0], Unavailable), results
        assert time.monotonic() - start < 10  # 5 intervals of 1 s, then the kill
        assert "event=worker_unresponsive" in server.log()
        (tmp_path / "models" / "slow" / "1" / "delay").write_text("0")
        wait_for(lambda: client.is_model_ready("slow"), 30, "the replacement", interval=0.1)
        assert client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_05_broker_crash_then_clean_restart(server_factory: Callable[..., ServerProcess]) -> None:
    """A killed server leaves its socket, lock and a dead client's segment: the next start reaps, rebinds."""
    first = server_factory()
    workers = first.workers()
    code = (
        "import numpy as np, os\n"
        "from zinfer.client import Client\n"
        f"c = Client({first.url!r}, timeout=30, inline_threshold=-1)\n"
        "c.infer('add', {'INPUT_A': np.ones((1, 1), np.float32), 'INPUT_B': np.ones((1, 1), np.float32)})\n"
        "os._exit(0)\n"
    )
    before = zinfer_segments()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    first.proc.kill()  # no cleanup at all
    first.proc.wait(10)
    wait_for(
        lambda: not any(p.is_running() and p.status() != "zombie" for p in workers), 10, "orphaned workers"
    )
    assert (first.runtime_dir / "zinfer.sock").exists()
    leftover = zinfer_segments() - before
    second = server_factory(MODELS, runtime_dir=first.runtime_dir.parent)
    assert not leftover & zinfer_segments(), "stale segments of dead clients should be reaped at start"
    with Client(second.url, timeout=30) as client:
        assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_16_oversized_tensor_is_refused_before_allocation(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(MODELS, "--max-tensor-bytes", str(1 << 20))
    big = np.zeros((1, 1 << 19), np.float32)  # 2 MiB
    for shm in (True, False):
        with Client(server.url, timeout=30, shm=shm) as client:
            with pytest.raises(InvalidArgument, match="byte limit"):
                client.infer("identity", {"INPUT0": big})
            assert client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_18_reply_to_a_vanished_client(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The client dies while its request runs: the reply cannot be delivered, the server carries on."""
    server = server_factory(_slow_repo(tmp_path, 0.5))
    code = (
        "import numpy as np, threading, os, time\n"
        "from zinfer.client import Client\n"
        f"c = Client({server.url!r}, timeout=30)\n"
        "threading.Thread(target=c.infer, args=('slow', {'INPUT_A': np.ones((1, 1), np.float32),"
        " 'INPUT_B': np.ones((1, 1), np.float32)}), daemon=True).start()\n"
        "time.sleep(0.3)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    wait_for(lambda: "event=reply_undeliverable" in server.log(), 10, "the undeliverable reply to be logged")
    (tmp_path / "models" / "slow" / "1" / "delay").write_text("0")
    with Client(server.url, timeout=30) as client:
        assert client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_24_region_unregistered_while_queued(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A client closes (unregisters and unlinks its arena) while its request waits: no use after unmap,
    the server keeps serving."""
    server = server_factory(_slow_repo(tmp_path, 0.3))
    client = Client(server.url, timeout=30, inline_threshold=-1)
    client._model_info("slow", 0)
    done: list[object] = []
    t = threading.Thread(
        target=lambda: done.append(_try(lambda: client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE})))
    )
    t.start()
    time.sleep(0.1)
    client.close()  # from another thread, while the request is in flight
    t.join(10)
    with Client(server.url, timeout=30) as other:
        assert other.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
    assert server.proc.poll() is None


def _try(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc
