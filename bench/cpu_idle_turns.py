"""Where a c32 rate goes, Triton beside zinfer's front door: CPU per request of every process, perf_analyzer
included, the machine's idle time, and how often each server's threads are switched out, in turns.

Both servers are up at once (Triton 2.51 from the pip wheels, ``triton_side.py``; ``zinfer serve`` with its
front door, ``bench_frontdoor.zinfer_front_door``) on the same repository (``vs_triton_repo.py``: the
``TritonPythonModel`` ``add``). Each round drives ``add`` at concurrency 32 through one perf_analyzer step
per server (``bench_frontdoor.perf_analyzer``, 1 s windows), the servers' order reversed every other round.
Over each step:

* the rate perf_analyzer reports;
* perf_analyzer's own CPU (its rusage as a finished child of this process), over the step's wall time;
* each server process's CPU by role (zinfer: broker, door, workers; Triton: tritonserver, its Python stubs);
* the machine's idle time (``/proc/stat``), in ms per second;
* per request, each role's voluntary context switches (the thread slept: a wake) and involuntary ones (it
  was switched out while it could run), summed over its threads (``/proc/PID/task/TID/status``).

CPU per request, all processes: perf_analyzer's and the server's CPU over the requests of the step. When it
is about equal on both sides, the rate follows the idle time: 2 CPUs minus idle, over the CPU per request.

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/cpu_idle_turns.py --triton-venv DIR [--rounds 4]
[--protocol http|grpc] [--label L]``. Results: bench/results/cpu_idle_turns.json (a run per label).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, MODELS, Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_frontdoor_ensemble import _cpu_by_role, _role, _tree  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cpu_idle_turns.json"
INTERVAL_MS = 1000


def _threads(
    procs: list[psutil.Process], root: int, side: str
) -> dict[tuple[int, str], tuple[str, int, int]]:
    """Every thread's role and voluntary and involuntary context switches so far."""
    out = {}
    for p in procs:
        with contextlib.suppress(OSError, psutil.Error):
            role = _role(p, root, side)
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    text = Path(f"/proc/{p.pid}/task/{tid}/status").read_text()
                    vol = int(text.split("\nvoluntary_ctxt_switches:")[1].split()[0])
                    invol = int(text.split("\nnonvoluntary_ctxt_switches:")[1].split()[0])
                    out[(p.pid, tid)] = (role, vol, invol)
    return out


def _idle() -> float:
    """The machine's idle seconds so far (all CPUs)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


def turn(pa: Path, env: dict[str, str], target: Target, root: int, protocol: str) -> dict[str, Any]:
    """One perf_analyzer step on ``target`` (its server's processes under ``root``), with the figures of the
    module's docstring."""
    procs, side = _tree(root), target.name
    cpu0, threads0 = _cpu_by_role(procs, root, side), _threads(procs, root, side)
    idle0, pa0, t0 = _idle(), _children_cpu(), time.monotonic()
    fig = perf_analyzer(pa, env, target, protocol, "add", 32, ADD_SHAPES, INTERVAL_MS)
    cpu1, threads1 = _cpu_by_role(procs, root, side), _threads(procs, root, side)
    idle1, pa1, t1 = _idle(), _children_cpu(), time.monotonic()
    wall = t1 - t0
    rate = fig["throughput_s"]
    requests = rate * wall
    server = {role: 1e3 * (cpu1[role] - cpu0.get(role, 0.0)) / wall for role in cpu1}
    switches: dict[str, list[float]] = {}
    for key, (role, vol, invol) in threads1.items():
        if key in threads0:
            _, vol0, invol0 = threads0[key]
            sums = switches.setdefault(role, [0.0, 0.0])
            sums[0] += vol - vol0
            sums[1] += invol - invol0
    pa_ms = 1e3 * (pa1 - pa0) / wall
    return {
        "throughput_s": rate,
        "wall_s": round(wall, 2),
        "perf_analyzer_cpu_ms_s": round(pa_ms, 1),
        "server_cpu_ms_s": {k: round(v, 1) for k, v in sorted(server.items())},
        "cpu_us_per_request_all": round((pa_ms + sum(server.values())) * 1e3 / rate, 1),
        "idle_ms_s": round(1e3 * (idle1 - idle0) / wall, 1),
        "voluntary_per_request": {k: round(v[0] / requests, 3) for k, v in sorted(switches.items())},
        "involuntary_per_request": {k: round(v[1] / requests, 3) for k, v in sorted(switches.items())},
    }


def _line(name: str, f: dict[str, Any]) -> str:
    server = " ".join(f"{k} {v:.0f}" for k, v in f["server_cpu_ms_s"].items())
    invol = " ".join(f"{k} {v:.2f}" for k, v in f["involuntary_per_request"].items())
    return (f"  {name:7} {f['throughput_s']:8.0f}/s  perf_analyzer {f['perf_analyzer_cpu_ms_s']:4.0f} ms/s  "
            f"server ms/s: {server}  all {f['cpu_us_per_request_all']:.0f} us/req  idle "
            f"{f['idle_ms_s']:.0f} ms/s  switched out per req: {invol}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="Triton 2.51 and perf_analyzer")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--label", default="run")
    args = ap.parse_args()
    pa = args.triton_venv / "bin" / "perf_analyzer"
    install = triton_side.find(args.triton_venv)
    if install is None or not pa.exists():
        print("needs tritonserver and perf_analyzer in --triton-venv (tritonclient 2.51's wheels)")
        return 1
    env_dir = Path(tempfile.mkdtemp(prefix="zci-env-"))
    rounds: list[dict[str, Any]] = []
    try:
        env = triton_side._environment(install, env_dir)
        with tempfile.TemporaryDirectory(prefix="zci-repo-") as tmp, contextlib.ExitStack() as stack:
            repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
            served = stack.enter_context(triton_side.serve(install, repo, MODELS))
            triton = Target("triton", served.grpc, served.http)
            zinfer = stack.enter_context(zinfer_front_door(repo, 1))
            if zinfer.door_pid is None:
                raise RuntimeError("zinfer's front door process was not found")
            broker = psutil.Process(zinfer.door_pid).parent()
            if broker is None:
                raise RuntimeError("zinfer's broker process was not found")
            roots = {"triton": served.pid, "zinfer": broker.pid}
            for r in range(args.rounds):
                got: dict[str, Any] = {}
                for target in (triton, zinfer) if r % 2 == 0 else (zinfer, triton):
                    got[target.name] = turn(pa, env, target, roots[target.name], args.protocol)
                    print(_line(target.name, got[target.name]), flush=True)
                got["ratio"] = round(got["zinfer"]["throughput_s"] / got["triton"]["throughput_s"], 3)
                print(f"round {r}: zinfer/Triton {got['ratio']}", flush=True)
                rounds.append(got)
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    summary = {
        name: {
            key: round(statistics.median(r[name][key] for r in rounds), 1)
            for key in ("throughput_s", "perf_analyzer_cpu_ms_s", "cpu_us_per_request_all", "idle_ms_s")
        }
        for name in ("triton", "zinfer")
    }
    summary["ratio_median"] = round(statistics.median(r["ratio"] for r in rounds), 3)
    print("medians:", json.dumps(summary))
    command = (
        "PYTHONPATH=COMPILED_TREE .venv/bin/python bench/cpu_idle_turns.py --triton-venv DIR "
        f"--rounds {args.rounds} --protocol {args.protocol} --label {args.label}"
    )
    params = {"protocol": args.protocol, "rounds": args.rounds, "interval_ms": INTERVAL_MS, "concurrency": 32}
    record_run(RESULTS, args.label, command, {"params": params, "rounds": rounds, "medians": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
