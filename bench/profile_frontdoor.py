"""Where a front-door request's time goes: py-spy on the door process (and the broker) under perf_analyzer.

For gRPC and HTTP at concurrency 32 on the ``add`` model (``vs_triton_repo``), twice: the full door, and
the door answering from a recorded reply without the broker (``ZINFER_FRONTDOOR_SHORTCUT=1``,
``frontdoor/shortcut.py``). Their difference is the broker's hop (the bridge's request building and
reading, ZeroMQ, the broker, the worker); the profile of each splits the door's own time between the server
library, the protocol conversion and the bridge. Per run: throughput, the door's CPU per request (its CPU
time over the requests answered in the same window) and, from py-spy's samples (active threads only), the
top frames by own time and by time inclusive of callees. ``--case big``: the ``big`` model (4 MiB in and
out) at concurrency 8 with system shared memory instead.

Usage: ``.venv/bin/python bench/profile_frontdoor.py --triton-venv DIR [--seconds S] [--spy gil,native]``.
Needs py-spy in this venv (the dev install's) and perf_analyzer in ``--triton-venv``. Results:
bench/results/profile_frontdoor.json (replaced by each run; ``--results PATH`` for another file). Absolute
figures move with the machine's load; compare rows of one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "profile_frontdoor.json"
PYSPY = Path(sys.executable).parent / "py-spy"
SHORTCUT = "ZINFER_FRONTDOOR_SHORTCUT"
TOP = 25


def _processes() -> tuple[psutil.Process, psutil.Process]:
    """The broker (``zinfer serve``) and its front-door process, among this script's descendants."""
    broker = door = None
    for p in psutil.Process().children(recursive=True):
        cmd = " ".join(p.cmdline())
        if "zinfer.frontdoor.process" in cmd:
            door = p
        elif "zinfer.broker serve" in cmd:
            broker = p
    if broker is None or door is None:
        raise RuntimeError("no broker or front-door process found")
    return broker, door


def _frames(raw: Path) -> dict[str, Any]:
    """Top frames of a py-spy raw file (collapsed stacks, one sample count a line): own and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [f.strip() for f in stack.split(";")[1:]]  # the first is the process/thread
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n

    def top(c: collections.Counter[str]) -> list[list[Any]]:
        return [[f, round(100.0 * k / max(total, 1), 1)] for f, k in c.most_common(TOP)]

    return {"samples": total, "own_pct": top(own), "inclusive_pct": top(inclusive)}


SPY_FLAGS: list[str] = []  # --spy gil,native,threads: py-spy's own options (gil: samples holding the GIL)


def _record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    blocking = [] if "--native" in SPY_FLAGS else ["--nonblocking"]  # py-spy's native stacks stop the process
    cmd = [str(PYSPY), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100",
           *blocking, "--nolineno", "--format", "raw", "--output", str(out), *SPY_FLAGS]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


BIG_SHM = ("--shared-memory", "system", "--output-shared-memory-size", str(4 << 20))
CASES = {  # name -> (model, concurrency, shapes, perf_analyzer's extra options)
    "c32": ("add", 32, ADD_SHAPES, ()),
    "big": ("big", 8, {"INPUT0": vs_triton_repo.BIG_ELEMENTS}, BIG_SHM),
}


def one(pa: Path, env: dict[str, str], target: Target, protocol: str, seconds: float, tmp: Path,
        with_broker: bool, case: str = "c32") -> dict[str, Any]:  # fmt: skip
    """perf_analyzer on ``case`` (``CASES``) while py-spy records the door (and the broker) for
    ``seconds``."""
    model, concurrency, shapes, extra = CASES[case]
    broker, door = _processes()
    result: dict[str, Any] = {}
    done = threading.Event()

    def load() -> None:
        try:
            result["pa"] = perf_analyzer(pa, env, target, protocol, model, concurrency, shapes, 1500, extra)
        except Exception as exc:  # noqa: BLE001 - recorded, the profile still written
            result["pa"] = {"error": str(exc)[-500:]}
        done.set()

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(1.5)  # past perf_analyzer's start and first requests
    cpu0, t0 = sum(door.cpu_times()[:2]), time.monotonic()
    spies = {"door": _record(door.pid, seconds, tmp / f"{protocol}-door.txt")}
    if with_broker:
        spies["broker"] = _record(broker.pid, seconds, tmp / f"{protocol}-broker.txt")
    for spy in spies.values():
        spy.wait(seconds + 60)
    cpu1, t1 = sum(door.cpu_times()[:2]), time.monotonic()
    thread.join(300)
    pa_fig = result.get("pa", {"error": "perf_analyzer did not finish"})
    out: dict[str, Any] = {"perf_analyzer": pa_fig, "door_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3)}
    if "throughput_s" in pa_fig:
        out["door_cpu_us_per_request"] = round(1e6 * (cpu1 - cpu0) / ((t1 - t0) * pa_fig["throughput_s"]), 1)
    for name in spies:
        path = tmp / f"{protocol}-{name}.txt"
        out[f"{name}_profile"] = _frames(path) if path.exists() else {"error": "py-spy wrote nothing"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--triton-venv", type=Path, required=True, help="a venv with tritonclient 2.51's perf_analyzer"
    )
    ap.add_argument("--seconds", type=float, default=6.0, help="py-spy's window per run")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    ap.add_argument("--case", default="c32", choices=sorted(CASES), help="big: 4 MiB, c8, system shm")
    ap.add_argument("--modes", default="full,no-broker")
    ap.add_argument("--spy", default="", help="py-spy options by name: gil,native,threads,idle")
    args = ap.parse_args()
    SPY_FLAGS[:] = [f"--{f}" for f in args.spy.split(",") if f]
    pa = args.triton_venv / "bin" / "perf_analyzer"
    if not pa.exists() or not PYSPY.exists():
        print("needs perf_analyzer in --triton-venv and py-spy beside this interpreter")
        return 1
    install = triton_side.find(args.triton_venv) or triton_side.TritonInstall(
        args.triton_venv, args.triton_venv / "bin" / "python", Path()
    )
    env_dir = Path(tempfile.mkdtemp(prefix="zfp-env-"))
    runs: dict[str, Any] = {}
    try:
        env = triton_side._environment(install, env_dir)
        with tempfile.TemporaryDirectory(prefix="zfp-") as tmp_name:
            tmp = Path(tmp_name)
            repo = vs_triton_repo.write(tmp / "models", zinfer_only=False)
            for mode in args.modes.split(","):
                os.environ[SHORTCUT] = "1" if mode == "no-broker" else "0"
                with zinfer_front_door(repo, 1) as target:
                    for protocol in args.protocols.split(","):
                        key = f"{mode} {protocol} {args.case}"
                        runs[key] = one(
                            pa, env, target, protocol, args.seconds, tmp, mode == "full", args.case
                        )
                        fig = runs[key]["perf_analyzer"]
                        shown = f"{fig['throughput_s']:8.0f}/s" if "throughput_s" in fig else "failed"
                        print(f"{key:22s} {shown}  door cpu {runs[key].get('door_cpu_us_per_request', '-')} "
                              f"us/request", flush=True)  # fmt: skip
                        for f, pct in runs[key]["door_profile"].get("own_pct", [])[:8]:
                            print(f"    {pct:5.1f}%  {f}")
    finally:
        os.environ.pop(SHORTCUT, None)
        shutil.rmtree(env_dir, ignore_errors=True)
    result = {"machine": machine(), "params": {"seconds": args.seconds, "case": args.case}, "runs": runs}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
