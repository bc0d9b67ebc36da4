"""How fast a waiting client learns that something failed: the figures the tests only bound.

Scenarios, each repeated ``--repeats`` times on a fresh server (bounded in count and time):

- ``server_killed``: the server is SIGKILLed while a call waits on a 30 s model; the call fails with
  ``ConnectionFailed``. Limit: the client's heartbeat interval (the promise is two of them).
- ``server_frozen``: the server is SIGSTOPped instead (alive, silent). Same limit.
- ``worker_killed``: the model's worker is SIGKILLed while it runs the call; the call fails with
  ``Unavailable``. Limit: the broker's reap interval (it polls its children every 50 ms).
- ``execution_limit``: the model spins past ``execution_timeout_ms`` 300; the call fails with
  ``DeadlineExceeded``. Figure: time from the limit to the error (the overshoot).

Each line prints the median and worst notice time beside its limit, as a ratio. Results go to
bench/results/bench_failure_notice.json.

Usage: ``.venv/bin/python bench/bench_failure_notice.py [--repeats N]`` (default 3; about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROOT, machine  # noqa: E402

from zinfer.client import Client  # noqa: E402
from zinfer.client.errors import ConnectionFailed, DeadlineExceeded, Unavailable  # noqa: E402
from zinfer.client.link_watch import HEARTBEAT_INTERVAL_S  # noqa: E402

OUT = ROOT / "bench" / "results" / "bench_failure_notice.json"
ONE = np.ones((1, 1), np.float32)
LIMIT_MS = 300
REAP_S = 0.05  # broker/server.py's REAP_INTERVAL_S

SLOW = """
import pathlib, time
HERE = pathlib.Path(__file__).parent
class Model:
    def initialize(self, config):
        pass
    def execute(self, inputs):
        (HERE / "started").touch()
        if float(inputs["INPUT_A"].reshape(-1)[0]) < 0:
            while True:
                pass
        time.sleep(30)
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""


def _repo(tmp: Path) -> Path:
    repo = tmp / "models"
    for name, limit in (("slow", ""), ("spin", f"{LIMIT_MS}")):
        shutil.copytree(ROOT / "configs/models/add", repo / name)
        cfg = (repo / name / "config.pbtxt").read_text()
        cfg = cfg.replace('name: "add"', f'name: "{name}"').replace('backend: "zinfer"', 'backend: "python"')
        param = f'parameters {{ key: "execution_timeout_ms" value: {{ string_value: "{limit}" }} }}'
        param = param if limit else ""
        cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', param)
        (repo / name / "config.pbtxt").write_text(cfg)
        (repo / name / "1" / "model.py").write_text(SLOW)
    return repo


class Server:
    def __init__(self, repo: Path, tmp: Path) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="rt-", dir=tmp))
        self.log = self.runtime.parent / f"{self.runtime.name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics",
                 "--model-repository", str(repo), "--runtime-dir", str(self.runtime / "rt")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.url = f"ipc://{self.runtime / 'rt' / 'zinfer.sock'}"
        deadline = time.monotonic() + 60
        while "event=ready" not in self.log.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"server did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def workers(self, model: str) -> list[psutil.Process]:
        kids = psutil.Process(self.proc.pid).children(recursive=True)
        return [p for p in kids if model in p.cmdline()]

    def close(self) -> None:
        kids = []
        if self.proc.poll() is None:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        for p in kids:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(kids, timeout=10)


def _notice(server: Server, repo: Path, model: str, a: np.ndarray, act: Callable[[], None],
            expect: type[Exception]) -> float:  # fmt: skip
    """Seconds from ``act`` (run once the model started the call) to the call's ``expect`` error."""
    started = repo / model / "1" / "started"
    started.unlink(missing_ok=True)
    acted: list[float] = []

    def actor() -> None:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        acted.append(time.monotonic())
        act()

    with Client(server.url, timeout=60, inline_threshold=-1) as client:
        client.model_metadata(model)
        t = threading.Thread(target=actor)
        t.start()
        try:
            client.infer(model, {"INPUT_A": a, "INPUT_B": ONE})
            raise AssertionError(f"{model}: the call succeeded")
        except expect:
            failed = time.monotonic()
        finally:
            t.join(60)
    return failed - acted[0]


def run(repeats: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="zbf-", dir="/tmp"))
    repo = _repo(tmp)
    samples: dict[str, list[float]] = {k: [] for k in ("server_killed", "server_frozen", "worker_killed",
                                                         "execution_limit")}  # fmt: skip
    try:
        for _ in range(repeats):
            for scenario in samples:
                s = Server(repo, tmp)
                try:
                    if scenario == "server_killed":
                        took = _notice(s, repo, "slow", ONE, s.proc.kill, ConnectionFailed)
                    elif scenario == "server_frozen":
                        took = _notice(s, repo, "slow", ONE, lambda s=s: os.kill(s.proc.pid, signal.SIGSTOP),
                                       ConnectionFailed)  # fmt: skip
                    elif scenario == "worker_killed":
                        kill = lambda s=s: [p.kill() for p in s.workers("slow")]  # noqa: E731
                        took = _notice(s, repo, "slow", ONE, kill, Unavailable)
                    else:  # from the start of the execution; the limit itself is subtracted below
                        took = _notice(s, repo, "spin", -ONE, lambda: None, DeadlineExceeded) - LIMIT_MS / 1e3
                    samples[scenario].append(took)
                finally:
                    s.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    limits = {"server_killed": HEARTBEAT_INTERVAL_S, "server_frozen": HEARTBEAT_INTERVAL_S,
              "worker_killed": REAP_S, "execution_limit": REAP_S}  # fmt: skip
    out: dict[str, Any] = {"machine": machine(), "repeats": repeats, "scenarios": {}}
    print(f"{'scenario':<16} {'median s':>9} {'worst s':>8} {'limit s':>8} {'median/limit':>13}")
    for name, xs in samples.items():
        med, worst = statistics.median(xs), max(xs)
        out["scenarios"][name] = {"samples_s": xs, "median_s": med, "worst_s": worst, "limit_s": limits[name],
                                  "median_over_limit": med / limits[name]}  # fmt: skip
        print(f"{name:<16} {med:>9.3f} {worst:>8.3f} {limits[name]:>8.3f} {med / limits[name]:>13.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    result = run(max(1, min(args.repeats, 20)))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
