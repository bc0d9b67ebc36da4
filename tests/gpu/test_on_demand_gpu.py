"""On-demand model control with a device budget (``--memory-budget gpu0=...``) on a real GPU: the workers
report their device memory with their heartbeats, the broker evicts the least recently used models to stay
within the budget, and every answer is right.

Skipped (by tests/gpu/conftest.py) unless CuPy sees a CUDA device.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from tests.conftest import ServerProcess, start_server, stop_all, wait_for
from zinfer.client import Client

N = 1024  # W is N x N fp32 (4 MiB on the device), so each instance holds a measurable amount
MODELS = 6


def _write_repo(repo: Path) -> None:
    for k in range(1, MODELS + 1):
        name = f"gscale_{k}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "zinfer"\nmax_batch_size: 8\n'
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {N} ] }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {N} ] }} ]\n'
            "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
            'parameters { key: "kernel" value: { string_value: "linear" } }\n'
        )
        np.save(repo / name / "1" / "W.npy", np.eye(N, dtype=np.float32) * k)


def _device_bytes(client: Client, model: str) -> int:
    row = next(r for r in client.repository_index() if r["name"] == model)
    return int((row.get("device_bytes") or {}).get("gpu0", 0))


def _check(client: Client, k: int, rng: random.Random) -> None:
    x = np.full((1, N), float(rng.randint(-20, 20)), np.float32)
    y = client.infer(f"gscale_{k}", {"X": x}).as_numpy("Y")
    np.testing.assert_array_equal(y, x * k)


def test_a_device_budget_keeps_the_resident_models_within_it(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _write_repo(repo)
    rng = random.Random(35)
    servers: list[ServerProcess] = []
    try:
        free = start_server(repo, "--model-control-mode", "on-demand")
        servers.append(free)
        with Client(free.url, timeout=120) as client:
            _check(client, 1, rng)
            wait_for(lambda: _device_bytes(client, "gscale_1") >= 4 << 20, 30,
                     "gscale_1's device memory from its heartbeats")  # fmt: skip
            one = _device_bytes(client, "gscale_1")
        stop_all(servers)
        servers.clear()
        budget = int(2.5 * one)
        server = start_server(repo, "--model-control-mode", "on-demand", "--memory-budget", f"gpu0={budget}")
        servers.append(server)
        with Client(server.url, timeout=120) as client:
            for _ in range(30):
                _check(client, rng.randint(1, MODELS), rng)
                resident = sum(_device_bytes(client, f"gscale_{k}") for k in range(1, MODELS + 1))
                assert resident <= budget, f"{resident} bytes on gpu0 over the budget of {budget}"
            status = client.server_status()["memory"]
            assert status["evictions"] >= 1, status
            assert status["budget"] == {"gpu0": budget}
        assert "event=model_evicted" in server.log()
    finally:
        stop_all(servers)


def test_workers_report_device_memory(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _write_repo(repo)
    server = start_server(repo, "--model-control-mode", "on-demand")
    try:
        with Client(server.url, timeout=120) as client:
            _check(client, 2, random.Random(1))
            wait_for(lambda: _device_bytes(client, "gscale_2") >= 4 << 20, 30, "a device memory report")
            assert _device_bytes(client, "gscale_3") == 0  # never loaded
    finally:
        stop_all([server])
