"""What a new user meets in the first hour, on real ``zinfer serve`` processes: a door whose extra is not
installed and a taken metrics port fail the start with one line saying what to do; the start-up log says
what loads, then one ready line with everything a user needs (and each failure once); an unsupported
Triton platform is named before any complaint about GPUs; a not-ready server says why; a misspelled flag
gets serve's usage; ``zinfer status --watch`` into ``head`` ends quietly; ``zinfer tune`` says what
bounded it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MODELS, ServerProcess, start_server, stop_all, wait_for
from tests.frontdoor_helpers import free_port
from zinfer.client import Client
from zinfer.tools.tune_cli import main as tune_main

pytestmark = pytest.mark.integration

LOAD_DELAY_S = 6.0  # longer than the broker's LOAD_PROGRESS_S (5 s): one progress line comes first

SLOW = (
    'name: "slow"\nbackend: "python"\nmax_batch_size: 8\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    "instance_group [ { kind: KIND_CPU count: 1 } ]\n",
    f"""
    import time

    class Model:
        def initialize(self, config):
            time.sleep({LOAD_DELAY_S})

        def execute(self, inputs):
            return {{"Y": inputs["X"]}}
    """,
)
BAD = (
    'name: "bad"\nbackend: "python"\nmax_batch_size: 8\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    "instance_group [ { kind: KIND_CPU count: 2 } ]\n",
    """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("boom in initialize")

        def execute(self, requests):
            return []
    """,
)
CRASH = (
    BAD[0].replace('"bad"', '"crash"').replace("count: 2", "count: 1"),
    """
    import os

    class Model:
        def initialize(self, config):
            os._exit(3)  # dies without reporting a load failure

        def execute(self, inputs):
            return inputs
    """,
)
TRT = (
    'name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    "instance_group [ { kind: KIND_GPU count: 1 } ]\n",
    None,
)


def _repo(root: Path, **models: tuple[str, str | None]) -> Path:
    repo = root / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    for name, (config, code) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        if code is not None:
            (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
        else:
            (repo / name / "1" / "model.plan").write_bytes(b"\0" * 16)
    return repo


def _serve(repo: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``zinfer serve`` that is expected to exit by itself (a start failure)."""
    return subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repo), *flags],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def _hiding(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment in which ``import module`` fails as it does where the extra is not installed."""
    hidden = tmp_path / "hide"
    hidden.mkdir(exist_ok=True)
    (hidden / f"{module}.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize(("flag", "module"), [("--grpc", "grpc"), ("--http", "httptools")])
def test_a_door_without_its_extra_fails_the_start_with_one_line(
    tmp_path: Path, flag: str, module: str
) -> None:
    repo = _repo(tmp_path)
    run = _serve(repo, "--runtime-dir", str(tmp_path / "rt"), "--metrics", "127.0.0.1:0",
                 flag, f"127.0.0.1:{free_port()}", env=_hiding(tmp_path, module))  # fmt: skip
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "level=ERROR" in line]
    assert len(errors) == 1, run.stderr
    assert flag in errors[0] and f"No module named '{module}'" in errors[0]
    assert "pip install 'zinfer[frontdoor]'" in errors[0]
    assert "Traceback" not in run.stderr and "event=worker_spawned" not in run.stderr  # nothing started


def test_a_taken_metrics_port_names_the_address_and_the_flags(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        run = _serve(repo, "--runtime-dir", str(tmp_path / "rt"), "--metrics", address)
    assert run.returncode == 2, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if "level=ERROR" in line]
    assert address in line and "--metrics" in line and "--no-metrics" in line, line
    assert "Address already in use" in line
    assert "event=worker_spawned" not in run.stderr  # bound before any model loads


def test_serve_help_states_the_metrics_default() -> None:
    run = subprocess.run([sys.executable, "-m", "zinfer.broker", "serve", "--help"], capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0
    assert "default: 127.0.0.1:8002" in " ".join(run.stdout.split())


def test_a_misspelled_serve_flag_prints_serves_usage(tmp_path: Path) -> None:
    run = _serve(tmp_path, "--modle-control-mode", "explicit")
    assert run.returncode == 2
    assert run.stderr.startswith("usage: zinfer serve "), run.stderr
    assert "zinfer serve: error: unrecognized arguments: --modle-control-mode explicit" in run.stderr


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_start_up_says_what_loads_then_one_ready_line_with_each_failure_once(tmp_path: Path) -> None:
    """``add`` loads, ``slow`` takes LOAD_DELAY_S, ``bad`` (two instances) raises in initialize, ``trt`` is
    a TensorRT plan on KIND_GPU. The log: a progress line while ``slow`` loads; each failure once; the trt
    model's reason is its platform (no word of GPUs); one ready line naming the socket, the door, metrics,
    the build and each failed model once. The HTTP door's health says why the server is not ready."""
    repo = _repo(tmp_path, slow=SLOW, bad=BAD, crash=CRASH, trt=TRT)
    http = f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--http", http, wait_ready=False)
    try:
        listening = "event=http_frontdoor_listening"
        wait_for(lambda: listening in server.log() or server.proc.poll() is not None, 60, "the HTTP door")
        if "event=ready" not in server.log():  # still loading slow: not ready, and the body says so
            status, body = _get(f"http://{http}/v2/health/ready")
            if "event=ready" not in server.log():
                assert status == 400, body
                assert "not ready" in json.loads(body)["error"]
        wait_for(lambda: "event=ready" in server.log() or server.proc.poll() is not None, 90, "readiness")
        log = server.log()
        assert server.proc.poll() is None, log
        lines = log.splitlines()
        assert "event=starting " in lines[0] and "compiled=" in lines[0], lines[0]  # deployment.md's words
        (ready,) = [line for line in lines if "event=ready " in line]
        assert "event=loading " in log and "waiting=slow" in log, log  # progress while slow loads
        assert lines.index(next(x for x in lines if "event=loading " in x)) < lines.index(ready)
        assert re.search(r"event=ready models=add:1,slow:1 failed=bad,crash,trt ", ready), ready
        assert f"socket=ipc://{server.runtime_dir}/zinfer.sock" in ready and f"http={http}" in ready
        assert "grpc=off" in ready and re.search(r"metrics=http://127\.0\.0\.1:\d+/metrics", ready)
        assert re.search(r" build=(pure|compiled|partly-compiled:\d+/\d+)", ready), ready
        # each failure once, and the TensorRT model's reason is its platform, not the GPU it asks for
        assert log.count("event=model_load_failed model=bad ") == 1, log
        assert log.count("boom in initialize") == 1, log
        (trt,) = [line for line in lines if "event=model_load_failed model=trt " in line]
        assert "tensorrt_plan" in trt and "is not supported by zinfer" in trt
        assert "GPU" not in trt and "CuPy" not in trt
        assert "InstanceKind." not in log
        wait_for(lambda: server.log().count("event=worker_exited model=bad") == 2, 30, "bad's workers")
        exits = [x for x in server.log().splitlines() if "event=worker_exited" in x]
        # bad's workers reported their failure: their exits are expected; crash's worker died unreported
        assert all("level=INFO" in x for x in exits if "model=bad" in x), exits
        assert [x for x in exits if "level=WARNING" in x] == [x for x in exits if "model=crash" in x], exits
        assert log.count("event=model_load_failed model=crash ") == 1, log
        # the door logs as the server does
        door_lines = [x for x in server.log().splitlines() if "logger=zinfer.frontdoor" in x]
        assert door_lines and all(re.search(r" level=\w+ logger=zinfer\.frontdoor\S* frontdoor=0 event=", x)
                                  for x in door_lines), door_lines  # fmt: skip
        # ready but with failed models: Triton's 400, with the reason
        status, body = _get(f"http://{http}/v2/health/ready")
        reason = json.loads(body)["error"]
        assert status == 400 and "failed to load" in reason and "bad" in reason and "trt" in reason, reason
    finally:
        stop_all([server])


def test_a_normal_reload_logs_the_old_workers_exit_as_info(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "add")
    try:
        with Client(server.url, timeout=60) as client:
            client.load_model("add")  # a reload: new workers, the old ones told to stop
        wait_for(lambda: "event=worker_exited model=add" in server.log(), 30, "the old worker's exit")
        (line,) = [x for x in server.log().splitlines() if "event=worker_exited model=add" in x]
        assert "level=INFO" in line and line.endswith("code=0"), line
    finally:
        stop_all([server])


@pytest.fixture(scope="module")
def add_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """A server on a copy of ``add`` with explicit model control, and its repository."""
    repo = _repo(tmp_path_factory.mktemp("first-hour"))
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "add")
    try:
        yield server, repo
    finally:
        stop_all([server])


def test_status_watch_into_head_ends_without_a_traceback(add_server: tuple[ServerProcess, Path]) -> None:
    server, _ = add_server
    proc = subprocess.Popen(
        [sys.executable, "-m", "zinfer.broker", "status", "--url", server.url, "--watch", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its lines
    try:
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert first and code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_tune_says_what_bounded_it_when_nothing_fits(
    add_server: tuple[ServerProcess, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget nothing can meet: the table and the verdict go to stdout, with what bounded the sweep and
    the next step; the original config stays."""
    server, repo = add_server
    original = (repo / "add" / "config.pbtxt").read_text()
    code = tune_main(["-m", "add", "--model-repository", str(repo), "--url", server.url,
                      "--latency-budget-ms", "0.001", "--max-batch-size", "8", "--max-queue-delay-us", "0",
                      "--instance-count", "1", "--concurrency", "8", "--measurement-interval", "0.5",
                      "--output", str(tmp_path / "best.pbtxt")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "mbs=8" in out and "nothing written" in out  # the table and the verdict: stdout, as perf's
    assert "bounded by the latency budget: the lowest p99 was" in out, out
    assert "try --concurrency 1" in out and "raise --latency-budget-ms to at least" in out, out
    assert err == "", err
    assert not (tmp_path / "best.pbtxt").exists()
    assert (repo / "add" / "config.pbtxt").read_text() == original
