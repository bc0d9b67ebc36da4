"""A model stuck in one batch (a busy loop that keeps heartbeating): with the parameter
execution_timeout_ms its requests fail with DeadlineExceeded and its worker is restarted; without it,
zinfer status and /metrics show the instance busy, and for how long."""

from __future__ import annotations

import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client import Client
from zinfer.client.errors import DeadlineExceeded, Unavailable

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)
LOOP = -ONE  # INPUT_A < 0: the model never returns

SPIN_ADD = """
class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        if (inputs["INPUT_A"] < 0).any():
            while True:  # stuck: the worker's heartbeat thread keeps going
                pass
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""

SPIN_STREAM = """
import time

import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        words = bytes(inputs["TEXT"][0]).split()
        while True:  # "forever" streams without end, a response every 50 ms
            for word in words:
                yield {"TOKEN": np.array([word], dtype=object)}
                time.sleep(0.05)
            if words != [b"forever"]:
                return
"""


def _limit(limit_ms: int | None) -> str:
    if limit_ms is None:
        return ""
    return f'parameters {{ key: "execution_timeout_ms" value: {{ string_value: "{limit_ms}" }} }}\n'


def _spin_repo(tmp_path: Path, limit_ms: int | None) -> Path:
    """``spin``: an add model in Python that loops forever when INPUT_A is negative."""
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "spin")
    cfg = (repo / "spin" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "spin"').replace('backend: "zinfer"', 'backend: "python"')
    cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', _limit(limit_ms))
    (repo / "spin" / "config.pbtxt").write_text(cfg)
    (repo / "spin" / "1" / "model.py").write_text(SPIN_ADD)
    return repo


def _instance(client: Client, model: str) -> dict[str, object]:
    """The model's one instance in ``zinfer status`` (empty between a worker's death and its restart)."""
    m = next(m for m in client.server_status()["models"] if m["name"] == model)
    instances: list[dict[str, object]] = m["instances"]
    assert len(instances) <= 1, instances
    return instances[0] if instances else {}


def _busy_seconds(server: ServerProcess, model: str) -> float:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    busy = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "zinfer_worker_busy_seconds" and s.labels["model"] == model
    ]
    assert len(busy) == 1, busy
    return float(busy[0])


def test_busy_loop_past_the_execution_limit_fails_with_deadline_and_restarts(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(_spin_repo(tmp_path, 300))
    with Client(server.url, timeout=30) as client:
        assert client.infer("spin", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
        before = _instance(client, "spin")
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"execution limit \(execution_timeout_ms 300\)"):
            client.infer("spin", {"INPUT_A": LOOP, "INPUT_B": ONE})
        assert time.monotonic() - start >= 0.3  # not before its limit; DeadlineExceeded, not the 30 s timeout
        assert "event=execution_timeout model=spin" in server.log()
        old_pid = before["pid"]
        assert isinstance(old_pid, int)
        wait_for(lambda: not psutil.pid_exists(old_pid) or _zombie(old_pid), 10, "the stuck worker to die")
        wait_for(lambda: _instance(client, "spin").get("pid") not in (None, old_pid), 10, "the restart")
        wait_for(lambda: client.is_model_ready("spin"), 30, "the restarted instance", interval=0.1)
        after = _instance(client, "spin")
        assert after["restarts"] == 1 and after["busy_s"] is None
        assert client.infer("spin", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_without_a_limit_status_and_metrics_show_the_stuck_instance(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(_spin_repo(tmp_path, None))
    results: list[object] = []
    with Client(server.url, timeout=60) as client:
        assert _instance(client, "spin")["busy_s"] is None
        assert _busy_seconds(server, "spin") == 0

        def call() -> None:
            try:
                results.append(client.infer("spin", {"INPUT_A": LOOP, "INPUT_B": ONE}))
            except Exception as exc:
                results.append(exc)

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: (_instance(client, "spin")["busy_s"] or 0) > 1.0, 10, "status to show it busy")
        first = _instance(client, "spin")["busy_s"]
        first_metric = _busy_seconds(server, "spin")
        assert isinstance(first, float) and first_metric > 0.5
        wait_for(lambda: _busy_seconds(server, "spin") > first_metric + 0.5, 10, "the metric to grow")
        second = _instance(client, "spin")["busy_s"]
        assert isinstance(second, float) and second > first
        assert client.is_model_ready("spin")  # stuck, not dead: nothing without the limit ends it
        pid = _instance(client, "spin")["pid"]
        assert isinstance(pid, int)
        psutil.Process(pid).kill()  # end it by hand: the request fails as a dead worker's does
        t.join(10)
        assert len(results) == 1 and isinstance(results[0], Unavailable), results


def test_a_stream_past_the_execution_limit_ends_with_deadline(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Decoupled: the limit bounds the whole stream from the start of its batch, not each response."""
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "token_stream", repo / "token_stream")
    cfg = repo / "token_stream" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + _limit(500))
    (repo / "token_stream" / "1" / "model.py").write_text(SPIN_STREAM)
    server = server_factory(repo)
    with Client(server.url, timeout=30) as client:
        short = list(client.stream("token_stream", {"TEXT": np.array([b"a b"], dtype=object)}))
        assert [bytes(r.as_numpy("TOKEN")[0]) for r in short if not r.final] == [b"a", b"b"]
        tokens: list[bytes] = []
        old = {p.pid for p in server.workers()}
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="execution_timeout_ms 500"):
            for r in client.stream("token_stream", {"TEXT": np.array([b"forever"], dtype=object)}):
                tokens.append(bytes(r.as_numpy("TOKEN")[0]))
        assert time.monotonic() - start >= 0.5  # not before its limit
        assert len(tokens) >= 3 and set(tokens) == {b"forever"}  # responses came, then the limit

        def restarted() -> bool:  # the killed worker is gone and its replacement is ready
            pids = {p.pid for p in server.workers() if p.is_running() and p.status() != "zombie"}
            return bool(pids) and not pids & old and client.is_model_ready("token_stream")

        wait_for(restarted, 30, "the restart", interval=0.1)
        again = list(client.stream("token_stream", {"TEXT": np.array([b"x"], dtype=object)}))
        assert [bytes(r.as_numpy("TOKEN")[0]) for r in again if not r.final] == [b"x"]
