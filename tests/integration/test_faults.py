"""Faults from the reliability scenario table (docs/reliability.md): each test is named for its row."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for, zinfer_segments
from tests.gated import gated_model, pending
from tests.raw_client import Raw
from zinfer.client import Client, protocol
from zinfer.client.errors import InvalidArgument, Unavailable
from zinfer.client.protocol import Command
from zinfer.client.shm import Segment

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
        t.join(20)  # the client's own timeout is 30 s: an answer before it comes from the broker's heartbeats
        assert len(results) == 1 and isinstance(results[0], Unavailable), results
        assert "event=worker_unresponsive" in server.log()
        (tmp_path / "models" / "slow" / "1" / "delay").write_text("0")
        wait_for(lambda: client.is_model_ready("slow"), 30, "the replacement", interval=0.1)
        assert client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def test_scenario_05_broker_crash_then_clean_restart(server_factory: Callable[..., ServerProcess]) -> None:
    """A killed server leaves its socket, lock and its own segments (an ensemble's intermediates, checked to
    be there); the next start unlinks those segments and binds cleanly. Its dead client left nothing: a
    client's segments are memory files with no name."""
    first = server_factory()
    workers = first.workers()
    code = (
        "import numpy as np, os\n"
        "from zinfer.client import Client\n"
        f"c = Client({first.url!r}, timeout=30, inline_threshold=-1)\n"
        "c.infer('add', {'INPUT_A': np.ones((1, 1), np.float32), 'INPUT_B': np.ones((1, 1), np.float32)})\n"
        "c.infer('text_pipeline', {'TEXT': np.array([[b'crash me']], dtype=object)})\n"
        "os._exit(0)\n"
    )
    before = zinfer_segments()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    own = {n for n in zinfer_segments() - before if n.startswith(f"zinfer-s{first.proc.pid}-")}
    assert own, "the ensemble's intermediates should be in the server's own segments"
    assert zinfer_segments() - before == own  # the dead client left no named segment
    first.proc.kill()  # no cleanup at all
    first.proc.wait(10)
    # checked at once: any server started on this machine from now on reaps a dead server's segments
    assert own <= zinfer_segments(), "the killed server's segments are still there"
    assert (first.runtime_dir / "zinfer.sock").exists()
    wait_for(
        lambda: not any(p.is_running() and p.status() != "zombie" for p in workers), 10, "orphaned workers"
    )
    second = server_factory(MODELS, runtime_dir=first.runtime_dir.parent)
    assert not own & zinfer_segments(), "the crashed server's segments should be reaped at start"
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
    """The client dies while its request runs (held by the gate until then): the reply cannot be delivered,
    the server carries on."""
    gate = gated_model(tmp_path, "g")
    server = server_factory(tmp_path)
    code = (
        "import numpy as np, threading, os, time\n"
        "from zinfer.client import Client\n"
        f"c = Client({server.url!r}, timeout=30)\n"
        "threading.Thread(target=c.infer, args=('g', {'INPUT_A': np.ones((1, 1), np.float32),"
        " 'INPUT_B': np.ones((1, 1), np.float32)}), daemon=True).start()\n"
        f"while 'started 1' not in (open({str(gate.folder / 'log')!r}).read() "
        f"if os.path.exists({str(gate.folder / 'log')!r}) else ''):\n"
        "    time.sleep(0.01)\n"
        "os._exit(0)\n"
    )
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        gate.release_all()
        wait_for(lambda: "event=reply_undeliverable" in server.log(), 10, "the undeliverable reply logged")
        with Client(server.url, timeout=30) as client:
            assert client.infer("g", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
    finally:
        gate.release_all()


def test_scenario_24_region_unregistered_while_queued(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A request waits in the queue (behind a batch held running) naming a region; its connection then
    UNREGISTERs the region without cancelling the request. The request is answered with an error and never
    executes (the memory is still mapped by the client: only the server's checks keep it out), no worker
    dies, and the server serves the next request."""
    gate = gated_model(tmp_path, "g")
    server = server_factory(tmp_path)
    raw = Raw(server.url)
    seg = Segment.create_sealed(4096)
    try:
        np.frombuffer(seg.buf, np.float32)[:2] = 2.0
        assert raw.register(seg).status == protocol.Status.OK
        with Client(server.url, timeout=30) as holder, Client(server.url, timeout=30) as other:
            holder._model_info("g", 0)
            held = threading.Thread(target=lambda: holder.infer("g", {"INPUT_A": ONE, "INPUT_B": ONE}))
            held.start()
            gate.wait_started(1)
            tensor = {"datatype": "FP32", "shape": [1, 1], "shm": [seg.name, 0, 4]}
            header = {"id": "queued", "model": "g", "version": 0,
                      "inputs": [{"name": "INPUT_A", **tensor}, {"name": "INPUT_B", **tensor}],
                      "outputs": [{"name": "OUTPUT_SUM", "slot": [seg.name, 8, 4]}]}  # fmt: skip
            raw.send([bytes(f) for f in protocol.encode(Command.INFER, header)])
            wait_for(lambda: pending(server, "g") == 1, 10, "the request to wait in the queue")
            unregister = {"id": "unreg", "name": seg.name}
            raw.send([bytes(f) for f in protocol.encode(Command.UNREGISTER, unregister)])
            replies = {}
            while "unreg" not in replies:
                r = raw.reply()
                replies[r.request_id] = r
            assert replies["unreg"].status == protocol.Status.OK
            gate.release_all()
            held.join(30)
            while "queued" not in replies:
                r = raw.reply()
                replies[r.request_id] = r
            assert replies["queued"].status != protocol.Status.OK, "served from an unregistered region"
            three = np.full((1, 1), 3, np.float32)
            assert other.infer("g", {"INPUT_A": three, "INPUT_B": three}).as_numpy("OUTPUT_SUM")[0, 0] == 6
            assert gate.order() == [1, 3], "the request ran after its region was unregistered"
        assert "event=worker_exited" not in server.log()
        assert server.proc.poll() is None
    finally:
        gate.release_all()
        raw.close()
        seg.close()


def _try(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc
