"""Where a request's time goes at HTTP c32, zinfer's front door beside Triton: perf_analyzer's own latency
split, the machine's idle share, and how long each server process waited on a run queue for its CPU.

Triton 2.51 and ``zinfer serve --http`` (one front-door process) run on ``vs_triton_repo``'s repository at
once; perf_analyzer (tritonclient 2.51's) drives ``add`` over HTTP at concurrency 32, each server in turn,
the order reversed every other round. Per step it prints and keeps:

* perf_analyzer's CSV row: throughput, p50, and its split of the average latency: ``Client Send``,
  ``Network+Server Send/Recv`` (everything outside the server's own queue and compute: the client, HTTP,
  for zinfer the front door and its hop to the broker and back), ``Server Queue`` and ``Server Compute
  Input/Infer/Output`` (what the server reports: for zinfer the broker's queue and the worker's batch);
* the machine's idle share over the step (``/proc/stat``), and the machine's busy CPU per request (every
  process, perf_analyzer's included: what the rate would be on these cores with no idle time);
* per process, CPU and run-queue wait (``/proc/PID/task/*/schedstat``: time runnable but not running) in
  ms per second of the step: zinfer's front door, broker and ``add`` worker; tritonserver and its Python
  backend stubs.

A process whose run-queue wait is as large as its CPU time waits, on every wake-up, as long as it then
runs: on a serial process (the door) each request queued behind it waits that long too.

Usage: ``.venv/bin/python bench/pa_latency_parts.py --triton-venv DIR [--rounds 2] [--interval-ms 3000]
[--label L]`` (``PYTHONPATH=TREE`` for another zinfer tree, e.g. a compiled build). Results:
bench/results/pa_latency_parts.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import MODELS, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pa_latency_parts.json"
FIELDS = ("Inferences/Second", "p50 latency", "Client Send", "Network+Server Send/Recv", "Server Queue",
          "Server Compute Input", "Server Compute Infer", "Server Compute Output")  # fmt: skip


def _machine_ticks() -> tuple[int, int]:
    """(all ticks, idle + iowait ticks) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]


def _sched_ns(pids: list[int]) -> tuple[int, int]:
    """(CPU ns, run-queue wait ns) of every thread of ``pids`` (threads gone meanwhile are not counted)."""
    cpu = wait = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    a, b, _ = (task / "schedstat").read_text().split()
                    cpu, wait = cpu + int(a), wait + int(b)
    return cpu, wait


def _pa(
    pa: Path, env: dict[str, str], url: str, interval_ms: int, tmp: Path, protocol: str = "http"
) -> dict[str, float]:
    """perf_analyzer on ``add`` at concurrency 32 over ``protocol`` with fixed windows (a loaded machine
    never fails the step): the figures of its csv row (``FIELDS``). door_trace_parts and door_hop_shape run
    it too."""
    out = tmp / "pa.csv"
    out.unlink(missing_ok=True)
    cmd = [
        str(pa), "-m", "add", "-i", protocol, "-u", url, "--concurrency-range", "32",
        "--measurement-interval", str(interval_ms), "--stability-percentage", "1000", "--max-trials", "3",
        "-b", "1", "-f", str(out), "--shape", "INPUT_A:1", "--shape", "INPUT_B:1",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)
    if not out.exists():
        raise RuntimeError(f"perf_analyzer failed ({run.returncode}): {run.stderr[-800:]}")
    with open(out) as f:
        row = next(csv.DictReader(f))
    return {k: float(row[k]) for k in FIELDS if row.get(k)}


def step(
    pa: Path, env: dict[str, str], url: str, procs: dict[str, list[int]], interval_ms: int, tmp: Path
) -> dict[str, Any]:
    (t0, i0), w0 = _machine_ticks(), time.monotonic()
    s0 = {name: _sched_ns(pids) for name, pids in procs.items()}
    fig = _pa(pa, env, url, interval_ms, tmp)
    s1 = {name: _sched_ns(pids) for name, pids in procs.items()}
    t1, i1 = _machine_ticks()
    wall = time.monotonic() - w0
    sched = {
        name: {"cpu_ms_per_s": round((s1[name][0] - s0[name][0]) / 1e6 / wall, 1),
               "runqueue_wait_ms_per_s": round((s1[name][1] - s0[name][1]) / 1e6 / wall, 1)}
        for name in procs
    }  # fmt: skip
    idle = (i1 - i0) / max(1, t1 - t0)
    rate = fig.get("Inferences/Second", 0.0) or float("nan")
    for s in sched.values():
        s["cpu_us_per_request"] = round(s["cpu_ms_per_s"] * 1e3 / rate, 1)
    busy = (1 - idle) * (os.cpu_count() or 1) * 1e6 / rate  # every process's CPU, perf_analyzer's included
    return {
        "perf_analyzer": fig, "idle_pct": round(100 * idle, 1),
        "machine_cpu_us_per_request": round(busy, 1), "sched": sched,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="pytriton 0.7.0, tritonclient 2.51")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--label", default="latest")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    if install is None:
        print("no tritonserver in --triton-venv")
        return 2
    pa = args.triton_venv / "bin" / "perf_analyzer"
    rows: dict[str, list[dict[str, Any]]] = {"triton": [], "zinfer": []}
    with tempfile.TemporaryDirectory(prefix="zpl-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        (tmp / "env").mkdir()
        env = triton_side._environment(install, tmp / "env")
        repo = vs_triton_repo.write(tmp / "models", zinfer_only=False)
        tri = stack.enter_context(triton_side.serve(install, repo, MODELS))
        zin = stack.enter_context(zinfer_front_door(repo, 1))
        assert zin.door_pid is not None
        door = psutil.Process(zin.door_pid)
        broker = door.parent()
        assert broker is not None
        workers = [c.pid for c in broker.children() if "--model add " in " ".join(c.cmdline())]
        tpid = next(
            p.pid for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and Path(p.info["cmdline"][0]).name == "tritonserver"
            and str(repo) in " ".join(p.info["cmdline"])
        )  # fmt: skip
        stubs = [c.pid for c in psutil.Process(tpid).children(recursive=True)]
        procs = {
            "triton": {"tritonserver": [tpid], "stubs": stubs},
            "zinfer": {"door": [door.pid], "broker": [broker.pid], "worker": workers},
        }
        urls = {"triton": tri.http, "zinfer": zin.http}
        for r in range(args.rounds):
            for name in ("zinfer", "triton") if r % 2 == 0 else ("triton", "zinfer"):
                row = step(pa, env, urls[name], procs[name], args.interval_ms, tmp)
                rows[name].append(row)
                print(f"round {r} {name:6} {json.dumps(row)}", flush=True)
    medians = {
        name: {k: statistics.median(r["perf_analyzer"].get(k, 0.0) for r in runs) for k in FIELDS}
        | {
            "idle_pct": statistics.median(r["idle_pct"] for r in runs),
            "machine_cpu_us_per_request": statistics.median(r["machine_cpu_us_per_request"] for r in runs),
        }
        for name, runs in rows.items()
    }
    for name, m in medians.items():
        print(f"median {name:6} {json.dumps(m)}")
    command = (f"bench/pa_latency_parts.py --triton-venv DIR --rounds {args.rounds} "
               f"--interval-ms {args.interval_ms} --label {args.label}")  # fmt: skip
    record_run(RESULTS, args.label, command, {"medians": medians, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
