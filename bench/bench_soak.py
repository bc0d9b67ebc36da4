"""Soak: sustained load while workers are killed every few seconds and clients connect and die.

Reports requests sent, succeeded, failed with a clear error, and lost (no answer at all: must be 0), plus the
broker's RSS, its open descriptors (one per registered region: dying clients' must be released by their
connections) and the count of /dev/shm entries at start and end (all should stay flat).

Usage: ``.venv/bin/python bench/bench_soak.py [--seconds N]`` (default 120; bounded in time and count).
Results go to bench/results/bench_soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import RESULTS, machine, zinfer_server  # noqa: E402

from zinfer.client import Client  # noqa: E402
from zinfer.client.errors import RequestTimeout, ZinferError  # noqa: E402

OUT = RESULTS.parent / "bench_soak.json"
DYING_CLIENT = """
import numpy as np, os, random, sys
from zinfer.client import Client
c = Client(sys.argv[1], timeout=10, inline_threshold=-1)
for _ in range(random.randint(5, 50)):
    try:
        c.infer("add", {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.ones((1, 1), np.float32)})
    except Exception:
        pass
os._exit(0)  # no close(): the server must reap what it leaves
"""


def shm_entries() -> int:
    return sum(1 for n in os.listdir("/dev/shm") if n.startswith("zinfer"))


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "ok": 0, "clear_error": 0, "lost": 0, "wrong": 0}
        self.errors: dict[str, int] = {}

    def add(self, key: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if error:
                self.errors[error] = self.errors.get(error, 0) + 1


def loader(url: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        with Client(url, timeout=20, inline_threshold=int(rng.choice([-1, 4096]))) as c:
            for _ in range(int(rng.integers(50, 300))):
                if stop.is_set():
                    break
                model = "add" if rng.random() < 0.8 else "identity"
                a = rng.standard_normal((1, 1 if model == "add" else int(rng.integers(1, 20000)))).astype(
                    np.float32
                )
                inputs = {"INPUT_A": a, "INPUT_B": a} if model == "add" else {"INPUT0": a}
                tally.add("sent")
                try:
                    out = c.infer(model, inputs).as_numpy("OUTPUT_SUM" if model == "add" else "OUTPUT0")
                    tally.add("ok" if np.array_equal(out, a + a if model == "add" else a) else "wrong")
                except RequestTimeout:
                    tally.add("lost")
                except ZinferError as exc:
                    tally.add("clear_error", type(exc).__name__)


def killer(server_pid: int, stop: threading.Event, every_s: float, kills: list[int]) -> None:
    rng = random.Random(7)
    while not stop.wait(every_s):
        workers = [p for p in psutil.Process(server_pid).children() if "--model add" in " ".join(_cmd(p))
                   or "--model identity" in " ".join(_cmd(p))]  # fmt: skip
        if workers:
            victim = rng.choice(workers)
            try:
                victim.send_signal(signal.SIGKILL)
                kills.append(victim.pid)
            except psutil.Error:
                pass


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def dying_clients(url: str, stop: threading.Event, spawned: list[int]) -> None:
    while not stop.wait(1.5):
        proc = subprocess.Popen([sys.executable, "-c", DYING_CLIENT, url])
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        spawned.append(proc.pid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--kill-every", type=float, default=10.0)  # faster looks like a crash loop (5 a minute)
    ap.add_argument("--loaders", type=int, default=6)
    args = ap.parse_args()
    shm_start = shm_entries()
    with zinfer_server() as url:
        server = next(p for p in psutil.Process().children() if "serve" in " ".join(_cmd(p)))
        time.sleep(1.0)
        rss_start = server.memory_info().rss
        fds_start = server.num_fds()
        tally, stop, kills, spawned = Tally(), threading.Event(), [], []
        threads = [threading.Thread(target=loader, args=(url, stop, tally, i)) for i in range(args.loaders)]
        threads.append(threading.Thread(target=killer, args=(server.pid, stop, args.kill_every, kills)))
        threads.append(threading.Thread(target=dying_clients, args=(url, stop, spawned)))
        for t in threads:
            t.start()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(min(5.0, deadline - time.monotonic()))
            elapsed = args.seconds - (deadline - time.monotonic())
            print(f"  t={elapsed:5.0f}s {tally.counts} kills={len(kills)}", file=sys.stderr, flush=True)
        stop.set()
        for t in threads:
            t.join(60)
        time.sleep(3.0)  # let the broker reap the last dead clients' regions
        rss_end = server.memory_info().rss
        fds_end = server.num_fds()
        shm_server_end = shm_entries()
    result: dict[str, Any] = {
        "machine": machine(), "seconds": args.seconds, **tally.counts, "errors": tally.errors,
        "workers_killed": len(kills), "dying_clients": len(spawned),
        "broker_rss_start": rss_start, "broker_rss_end": rss_end,
        "broker_fds_start": fds_start, "broker_fds_end": fds_end,
        "shm_entries_start": shm_start, "shm_entries_end_server_up": shm_server_end,
        "shm_entries_end": shm_entries(),
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    print(f"lost = {tally.counts['lost']} (must be 0); wrong answers = {tally.counts['wrong']} (must be 0)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    return 0 if tally.counts["lost"] == 0 and tally.counts["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
