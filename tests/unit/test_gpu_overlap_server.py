"""The look-ahead end to end on a machine without a GPU: a real ``zinfer serve`` whose "GPU" workers run on
the fake CuPy (a ``cupy`` shim first on PYTHONPATH, for the broker's probe and the worker processes).

An instance with ``gpu_prefetch`` says READY twice, the broker then hands it a second batch while one runs,
and the worker stages that batch's copies while the fake GPU "computes" (each event reports done a few
milliseconds after it was recorded). Each worker process writes the fake's race report when it exits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, ServerProcess
from zinfer.client import Client

pytestmark = pytest.mark.integration

SHIM = """
import atexit, json, os, sys
from tests.gpu import fake_cupy

fake_cupy.COMPUTE_S = 0.003  # every batch "computes" for 3 ms, long enough for the next one to arrive
sys.modules["cupy"] = fake_cupy.module(int(os.environ.get("FAKE_GPUS", "1")))


def _report():
    path = os.path.join(os.environ["FAKE_CUPY_REPORTS"], f"{os.getpid()}.json")
    sets = sum(op.kind == "set" for op in fake_cupy.OPS)
    with open(path, "w") as f:
        devices = fake_cupy.calls("device")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        # the process's own command line: the worker empties sys.argv before model code runs
        with open("/proc/self/cmdline", "rb") as cmd:
            argv = [a.decode() for a in cmd.read().split(bytes(1)) if a]
        json.dump({"argv": argv, "hazards": fake_cupy.HAZARDS, "sets": sets, "visible": visible,
                   "devices": devices}, f)


atexit.register(_report)
"""

W = np.random.default_rng(4).standard_normal((8, 5)).astype(np.float32)


def test_a_gpu_prefetch_instance_gets_and_stages_a_second_batch_while_one_runs(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shim" / "cupy").mkdir(parents=True)
    (tmp_path / "shim" / "cupy" / "__init__.py").write_text(SHIM)
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'shim'}{os.pathsep}{ROOT}")
    monkeypatch.setenv("FAKE_CUPY_REPORTS", str(reports))
    repo = tmp_path / "repo"
    (repo / "lin" / "1").mkdir(parents=True)
    (repo / "lin" / "config.pbtxt").write_text(
        'name: "lin"\nbackend: "zinfer"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 8 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 5 ] } ]\n'
        "dynamic_batching { }\n"
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "linear" } },\n'
        '             { key: "gpu_prefetch" value: { string_value: "true" } } ]\n'
    )
    np.save(repo / "lin" / "1" / "W.npy", W)
    server = server_factory(repo, "--log-level", "DEBUG")
    x = np.random.default_rng(5).standard_normal((120, 8)).astype(np.float32)
    with Client(server.url, timeout=30, arena_bytes=8 << 20) as client:

        def one(i: int) -> np.ndarray:
            rows = x[i : i + 1 + i % 2]
            y: np.ndarray = client.infer("lin", {"X": rows}).as_numpy("Y")
            np.testing.assert_allclose(y, rows @ W, rtol=1e-5, atol=1e-6)
            return y

        with ThreadPoolExecutor(8) as pool:
            assert len(list(pool.map(one, range(100)))) == 100
    assert server.stop() == 0
    log = server.log()
    assert "event=gpu_prefetch model=lin instance=0" in log, log
    assert log.count("event=instance_ready model=lin") == 1, log
    assert "event=instance_prefetch model=lin" in log, log  # one instance, two places in the queue
    staged = log.count("event=staged batch=")
    assert staged > 0, log  # batches were handed over while one ran, and their copies started early
    assert "look_ahead_failed" not in log and "stage_skipped" not in log, log
    found = [json.loads(p.read_text()) for p in reports.glob("*.json")]
    workers = [r for r in found if "--endpoint" in r["argv"]]  # not the broker's GPU probe
    assert len(workers) == 1 and workers[0]["sets"] > 0 and workers[0]["hazards"] == [], workers


def test_each_gpu_worker_is_started_seeing_only_its_own_gpu(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two (fake) GPUs, one instance on each: each worker process starts with CUDA_VISIBLE_DEVICES set
    to its GPU and uses CUDA device 0, while its model still hears its own number (``gpu:1``)."""
    (tmp_path / "shim" / "cupy").mkdir(parents=True)
    (tmp_path / "shim" / "cupy" / "__init__.py").write_text(SHIM)
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'shim'}{os.pathsep}{ROOT}")
    monkeypatch.setenv("FAKE_CUPY_REPORTS", str(reports))
    monkeypatch.setenv("FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    repo = tmp_path / "repo"
    (repo / "where" / "1").mkdir(parents=True)
    (repo / "where" / "config.pbtxt").write_text(
        'name: "where"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "GPU" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 1 ] } ]\n"
    )
    (repo / "where" / "1" / "model.py").write_text(
        "import numpy as np\n\n\nclass Model:\n"
        "    def initialize(self, config):\n        self.id = config['device_id']\n\n"
        "    def execute(self, inputs):\n"
        "        return {'GPU': np.full((inputs['X'].shape[0], 1), self.id, np.int32)}\n"
    )
    server = server_factory(repo)
    with Client(server.url, timeout=30, arena_bytes=1 << 20) as client:
        got = client.infer("where", {"X": np.zeros((2, 1), np.float32)}).as_numpy("GPU")
    assert got.tolist() == [[1], [1]]
    assert server.stop() == 0
    found = [json.loads(p.read_text()) for p in reports.glob("*.json")]
    workers = [r for r in found if "--endpoint" in r["argv"]]
    assert len(workers) == 1 and "gpu:1" in workers[0]["argv"], workers
    assert workers[0]["visible"] == "1" and workers[0]["devices"][:1] == [0], workers
    probes = [r for r in found if "--endpoint" not in r["argv"]]
    assert all(r["visible"] is None for r in probes)  # the broker's probe saw both
