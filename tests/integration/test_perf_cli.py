"""``zinfer perf`` against a real server, with tiny bounds: the table, progress, CSV, JSON and plot."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, ServerProcess
from zinfer.tools.perf_cli import main

pytestmark = pytest.mark.integration


def test_concurrency_steps_with_threads_write_csv_and_json(
    bundled_server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_csv, out_json = tmp_path / "steps.csv", tmp_path / "run.json"
    code = main(["-m", "add", "-u", bundled_server.url, "--concurrency-range", "1:3:2",
                 "--measurement-interval", "1.2", "--max-requests", "300", "--csv", str(out_csv),
                 "--json", str(out_json)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr()
    assert "p99 us" in printed.out and "concurrency 3" in printed.out
    with out_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["concurrency"] for r in rows] == ["1", "3"]
    for r in rows:
        assert r["mode"] == "concurrency" and r["request_rate"] == ""
        assert 0 < int(r["requests"]) <= 300 and r["errors"] == "0"
        assert int(r["server_requests"]) == int(r["requests"])  # the statistics difference sees them all
        assert float(r["throughput_infer_s"]) > 0 and float(r["mean_batch"]) >= 1.0
        assert float(r["p50_us"]) <= float(r["p90_us"]) <= float(r["p95_us"]) <= float(r["p99_us"])
    run = json.loads(out_json.read_text())
    assert run["model"] == "add" and run["async"] is False and run["url"] == bundled_server.url
    assert [s["requests"] for s in run["steps"]] == [int(r["requests"]) for r in rows]


def test_request_rate_steps_with_asyncio_and_shared_memory(
    bundled_server: ServerProcess, tmp_path: Path
) -> None:
    out_json = tmp_path / "run.json"
    code = main(["-m", "linear", "-u", bundled_server.url, "--request-rate-range", "100:200:100",
                 "--request-distribution", "poisson", "--measurement-interval", "0.6", "--async", "--shm",
                 "--json", str(out_json), "-q"])  # fmt: skip
    assert code == 0
    run = json.loads(out_json.read_text())
    assert run["async"] is True and run["shm"] is True and run["request_distribution"] == "poisson"
    steps = run["steps"]
    assert [(s["mode"], s["request_rate"]) for s in steps] == [
        ("request_rate", 100.0),
        ("request_rate", 200.0),
    ]
    for s in steps:
        assert s["errors"] == 0 and s["requests"] > 10
        assert s["server_requests"] == s["requests"]
        assert s["server_compute_infer_us"] > 0


def test_module_entry_shows_progress_and_takes_shapes_and_npz(
    bundled_server: ServerProcess, tmp_path: Path
) -> None:
    npz = tmp_path / "inputs.npz"
    np.savez(npz, INPUT_A=np.ones(1, np.float32), INPUT_B=np.full(1, 2.0, np.float32))
    done = subprocess.run(
        [sys.executable, "-m", "zinfer.tools.perf_cli", "-m", "add", "-u", bundled_server.url,
         "--input-data", str(npz), "-b", "4", "--measurement-interval", "1.5", "--no-shm"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[concurrency 1]" in done.stderr and "done" in done.stderr  # a progress line a second
    assert "concurrency 1" in done.stdout.splitlines()[-1]
    variable = ["-m", "identity", "-u", bundled_server.url, "--measurement-interval", "0.3", "-q"]
    assert main(variable) == 1  # identity's dims are variable: it says to give --shape
    assert main([*variable, "--shape", "INPUT0:3000", "--max-requests", "20"]) == 0


def test_plot_without_matplotlib_says_how_to_get_it(
    bundled_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    args = ["-m", "add", "-u", bundled_server.url, "--measurement-interval", "0.3", "-q"]
    assert main([*args, "--plot", str(tmp_path / "p.png")]) == 2  # before any load is sent
    assert "zinfer[plot]" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_plot_draws_throughput_against_p99(bundled_server: ServerProcess, tmp_path: Path) -> None:
    import matplotlib  # noqa: F401 - in the test extra: a missing one fails here, it is not skipped

    args = ["-m", "add", "-u", bundled_server.url, "--measurement-interval", "0.3", "-q"]
    assert main([*args, "--concurrency-range", "1:2", "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreachable_server_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-m", "add", "-u", f"ipc://{tmp_path}/none.sock", "--measurement-interval", "0.2"]) == 1
    assert "ConnectionFailed" in capsys.readouterr().err
