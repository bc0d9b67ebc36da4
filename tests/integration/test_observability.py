"""Metrics, health endpoints, statistics and ``zinfer status`` over a real server under load."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _samples(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(server.http_url + "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    key = tuple(sorted(labels.items()))
    return samples.get((name, key), samples.get((name + "_total", key), 0.0))


def test_metrics_count_what_was_sent(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    errors: list[str] = []

    def load(n: int) -> None:
        with Client(server.url, timeout=30) as c:
            for _ in range(n):
                try:
                    c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})
                except Exception as exc:
                    errors.append(repr(exc))

    threads = [threading.Thread(target=load, args=(150,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    with Client(server.url, timeout=30) as c:
        with pytest.raises(InvalidArgument):  # refused before queueing: not a model failure
            c.infer("add", {"INPUT_A": ONE.astype(np.float64), "INPUT_B": ONE})
        stats = c.statistics("add")["model_stats"][0]
    m = _samples(server)
    labels = {"model": "add", "version": "1"}
    assert _value(m, "nv_inference_request_success", **labels) == 1200
    assert _value(m, "nv_inference_count", **labels) == 1200
    assert _value(m, "nv_inference_exec_count", **labels) == stats["execution_count"]
    assert _value(m, "nv_inference_request_duration_us", **labels) > 0
    assert _value(m, "nv_inference_queue_duration_us", **labels) > 0
    assert _value(m, "nv_inference_compute_infer_duration_us", **labels) > 0
    # the batch-size histogram agrees with the statistics call
    by_size = {b["batch_size"]: b["count"] for b in stats["batch_stats"]}
    assert _value(m, "zinfer_batch_size_count", **labels) == sum(by_size.values())
    for size in (1, 2, 4, 8, 16):
        below = sum(c for s, c in by_size.items() if s <= size)
        assert _value(m, "zinfer_batch_size_bucket", le=f"{float(size)}", **labels) == below
    assert _value(m, "zinfer_input_bytes_total", **labels) == 1200 * 8


def test_failures_carry_their_reason(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    server = server_factory(repo)
    with Client(server.url, timeout=30) as c:
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})
        victim = next(p for p in server.workers() if "--model add" in " ".join(p.cmdline()))
        victim.kill()
        wait_for(lambda: _get(server.http_url + "/v2/models/add/ready")[0] == 503, 10, "readiness to drop")
        assert _get(server.http_url + "/v2/health/ready")[0] == 503
        wait_for(lambda: _get(server.http_url + "/v2/models/add/ready")[0] == 200, 30, "the restart")
        m = _samples(server)
        worker = {"model": "add", "version": "1", "model_instance": "0", "device": "cpu"}
        assert _value(m, "zinfer_worker_restarts_total", **worker) == 1
        assert _value(m, "zinfer_worker_up", **worker) == 1


def test_health_endpoints(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for name in ("add", "identity"):
        shutil.copytree(MODELS / name, repo / name)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "*")
    base = server.http_url
    assert _get(base + "/v2/health/live")[0] == 200
    wait_for(lambda: _get(base + "/v2/health/ready")[0] == 200, 5, "readiness to be published")
    assert _get(base + "/v2/models/identity/ready")[0] == 200
    assert _get(base + "/v2/models/identity/versions/1/ready")[0] == 200
    assert _get(base + "/v2/models/nope/ready")[0] == 404
    with Client(server.url, timeout=30) as c:
        c.unload_model("identity")
        wait_for(lambda: _get(base + "/v2/models/identity/ready")[0] != 200, 5, "the unload to show")
        c.load_model("identity")
        wait_for(lambda: _get(base + "/v2/models/identity/ready")[0] == 200, 5, "the load to show")


def test_zinfer_status_shows_models_and_instances(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    with Client(server.url, timeout=30) as c:
        for _ in range(20):
            c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})
        status = c.server_status()
    add = next(m for m in status["models"] if m["name"] == "add")
    assert add["state"] == "READY" and add["rate_1m"] > 0 and add["p99_ms_1m"] > 0
    assert add["instances"][0]["pid"] in [p.pid for p in server.workers()]
    assert add["instances"][0]["rss_bytes"] > 0
    done = subprocess.run([sys.executable, "-m", "zinfer.broker", "status", "--url", server.url],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "add" in done.stdout and "READY" in done.stdout


def test_no_metrics_flag_serves_none(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(MODELS, "--no-metrics")
    assert "event=http_listening" not in server.log()
