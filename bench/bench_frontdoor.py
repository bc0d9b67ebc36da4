"""zinfer's KServe v2 front door against Triton 2.51, measured by perf_analyzer on both, in one run.

One Triton model repository (``vs_triton_repo.py``: the ``TritonPythonModel`` ``add``, max_batch_size 64,
preferred [16, 32, 64], delay 500 µs; ``big``, 4 MiB in and out) is served by Triton (``tritonserver`` from
the pip wheels, see ``triton_side.py``) and by ``zinfer serve --grpc --http`` (its front door), both up at
once and measured in turns, Triton then zinfer within each step, by the same ``perf_analyzer`` binary
(tritonclient 2.51's):

* ``add`` at concurrency 32: throughput over gRPC and over HTTP;
* ``add`` at concurrency 1: p50 latency over gRPC and over HTTP;
* ``big`` (4 MiB) at concurrency 8 with ``--shared-memory system``: throughput over gRPC and over HTTP.

The throughput steps swing most from one run to the next on a shared machine (HTTP c32 gave 0.87 and 0.95
of Triton minutes apart; big over HTTP 2.48 and 1.43 in two runs a day apart with no change on its path), so
each is measured in rounds (3 with ``--quick``, 5 without, or
``--rounds N``), Triton and zinfer in turns, the order reversed every other round; its ratio is the median
of the rounds' own ratios, its figures those of that round, and every round's figures are kept beside them.

Ratios, zinfer / Triton, against the goals of issue 33: HTTP throughput at c32 >= 1.0, gRPC >= 0.6, p50 at
c1 <= 1.5 on both, big with system shared memory >= 1.5. Beside them, the door process's CPU per request at
c32 (its CPU time over the requests perf_analyzer counted in the same step) against the native
``AsyncClient``'s own CPU per request at 32 in flight on the same ``add`` (goal: at most 150 µs more). A
step that fails is recorded with its error. Every step is bounded (perf_analyzer's measurement windows and
trials, a timeout per call); every server is stopped by its pid. ``grpc_server`` in the results says which
server the gRPC door ran on (pygrpc-native when the ``frontdoor-native`` extra is installed).

Usage: ``.venv/bin/python bench/bench_frontdoor.py --triton-venv DIR [--quick] [--rounds N]
[--frontdoor-workers N]``.
Without a Triton install (no ``--triton-venv``, or no Triton there) nothing can drive the load: perf_analyzer
comes from the same wheel. With perf_analyzer but no tritonserver, only zinfer's half runs, and it says so.
Results: bench/results/bench_frontdoor.json (replaced by each run), or the file `--results` names.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_serving import ROOT, _stop, _wait_ready, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bench_frontdoor.json"
MODELS = ("add", "big")
ADD_SHAPES = {"INPUT_A": 1, "INPUT_B": 1}  # perf_analyzer's --shape for add: one row of each input
FULL = {"interval_ms": 3000, "rounds": 5}
QUICK = {"interval_ms": 1000, "rounds": 3}
GOALS = {  # (key, goal, "higher" or "lower" is better)
    "grpc_c32_throughput": (0.6, "higher"),
    "http_c32_throughput": (1.0, "higher"),
    "grpc_c1_p50": (1.5, "lower"),
    "http_c1_p50": (1.5, "lower"),
    "big_c8_shm_throughput": (1.5, "higher"),
    "big_c8_shm_http_throughput": (1.5, "higher"),
}
# measured in rounds: the throughput steps, whose ratio swings most from run to run
PAIRED = ("grpc_c32", "http_c32", "big_c8_shm", "big_c8_shm_http")
STEPS = {  # ratio key -> (step, figure)
    "grpc_c32_throughput": ("grpc_c32", "throughput_s"),
    "http_c32_throughput": ("http_c32", "throughput_s"),
    "grpc_c1_p50": ("grpc_c1", "p50_us"),
    "http_c1_p50": ("http_c1", "p50_us"),
    "big_c8_shm_throughput": ("big_c8_shm", "throughput_s"),
    "big_c8_shm_http_throughput": ("big_c8_shm_http", "throughput_s"),
}


@dataclass(frozen=True)
class Target:
    """Where perf_analyzer sends: a server's gRPC and HTTP addresses."""

    name: str
    grpc: str
    http: str
    door_pid: int | None = None  # zinfer's front-door process (its CPU is measured)
    broker_url: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _others_running() -> list[str]:
    """tritonserver or perf_analyzer processes not started by this run (another benchmark is measuring)."""
    busy = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "tritonserver" in (p.info["name"] or "") or "perf_analyzer" in cmd.split(" ")[0]:
            busy.append(f"{p.info['pid']} {cmd[:80]}")
    return busy


PA_TIMEOUT_S = 90  # one perf_analyzer step: under 30 s when it does not stall (_step_with_retry)


def perf_analyzer(
    pa: Path, env: dict[str, str], target: Target, protocol: str, model: str, concurrency: int,
    shapes: dict[str, int], interval_ms: int, extra: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """One perf_analyzer step; on these shared cores a step that fails the 25 % stability test is measured
    again accepting any spread (``stability_percentage`` says which)."""
    errors = []
    for stability in (25, 100):
        with tempfile.TemporaryDirectory(prefix="zfd-pa-") as tmp:
            out = Path(tmp) / "pa.csv"
            url = target.grpc if protocol == "grpc" else target.http
            cmd = [
                str(pa), "-m", model, "-i", protocol, "-u", url, "--concurrency-range", str(concurrency),
                "--measurement-interval", str(interval_ms), "--stability-percentage", str(stability),
                "--max-trials", "6", "-b", "1", "-f", str(out), *extra,
            ]  # fmt: skip
            for name, n in shapes.items():
                cmd += ["--shape", f"{name}:{n}"]
            cpu0, t0 = _cpu(target.door_pid), time.monotonic()
            run = subprocess.run(
                cmd, capture_output=True, text=True, env=env, timeout=PA_TIMEOUT_S, check=False
            )
            cpu1, t1 = _cpu(target.door_pid), time.monotonic()
            if out.exists():
                with open(out) as f:
                    row = next(csv.DictReader(f))
                fig = {k: float(v) for k, v in row.items() if k and v not in ("", None)}
                return {
                    "concurrency": concurrency,
                    "throughput_s": fig["Inferences/Second"],
                    "p50_us": fig.get("p50 latency", 0.0),
                    "p99_us": fig.get("p99 latency", 0.0),
                    "server_queue_us": fig.get("Server Queue", 0.0),
                    "server_compute_infer_us": fig.get("Server Compute Infer", 0.0),
                    "stability_percentage": stability,
                    **_cpu_per_request(cpu1 - cpu0, t1 - t0, fig["Inferences/Second"]),
                }
            errors.append(f"({run.returncode}) {run.stdout[-1500:]}{run.stderr[-1500:]}")
    raise RuntimeError(f"perf_analyzer failed on {target.name} {protocol} {model}:\n" + "\n".join(errors))


def _cpu(pid: int | None) -> float:
    """User and system CPU seconds of process ``pid`` so far (0 when none)."""
    if pid is None:
        return 0.0
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _cpu_per_request(cpu_s: float, wall_s: float, per_s: float) -> dict[str, float]:
    if cpu_s <= 0 or per_s <= 0:
        return {}
    return {"door_cpu_us_per_request": round(1e6 * cpu_s / (wall_s * per_s), 1)}


NATIVE = """
import asyncio, os, sys, time
import numpy as np
from zinfer.client import AsyncClient

async def main(url, seconds):
    async with AsyncClient(url) as client:
        a = np.ones((1, 1), np.float32)
        inputs = {"INPUT_A": a, "INPUT_B": a}
        await client.infer("add", inputs)
        done = 0
        end = time.monotonic() + seconds
        async def one():
            nonlocal done
            while time.monotonic() < end:
                await client.infer("add", inputs)
                done += 1
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(one() for _ in range(32)))
        c1, t1 = time.process_time(), time.monotonic()
        print(done / (t1 - t0), 1e6 * (c1 - c0) / done)

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def native_client(url: str, seconds: float) -> dict[str, Any]:
    """The native ``AsyncClient`` at 32 in flight on ``add``: its throughput and its own CPU per request."""
    run = subprocess.run([sys.executable, "-c", NATIVE, url, str(seconds)], capture_output=True, text=True,
                         timeout=seconds + 120, check=False)  # fmt: skip
    try:
        per_s, cpu_us = (float(x) for x in run.stdout.split())
    except ValueError:
        return {"error": (run.stdout + run.stderr)[-600:]}
    return {"throughput_s": round(per_s, 1), "client_cpu_us_per_request": round(cpu_us, 1)}


def door_cpu(zinfer: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    """The door's CPU per request at c32 against the native client's (goal: at most 150 µs more)."""
    out: dict[str, Any] = {}
    base = native.get("client_cpu_us_per_request")
    for step in ("grpc_c32", "http_c32"):
        door = zinfer.get(step, {}).get("door_cpu_us_per_request")
        if door is None or base is None:
            continue
        out[step] = {"door_us": door, "native_client_us": base, "extra_us": round(door - base, 1),
                     "goal_extra_us": 150, "met": bool(door - base <= 150)}  # fmt: skip
    return out


def _step_with_retry(
    pa: Path, env: dict[str, str], target: Target, protocol: str, model: str, concurrency: int,
    shapes: dict[str, int], interval_ms: int, extra: tuple[str, ...],
) -> dict[str, Any]:  # fmt: skip
    """One perf_analyzer step, run once more when it stalls (on 2 shared cores its 32 threads can keep its
    own measuring thread from running for minutes; a step normally takes under 30 s)."""
    try:
        return perf_analyzer(pa, env, target, protocol, model, concurrency, shapes, interval_ms, extra)
    except subprocess.TimeoutExpired as exc:
        step = f"{target.name} {protocol} {model} c{concurrency}"
        print(f"{step}: perf_analyzer stalled ({exc.timeout:g} s), once more")
    fig = perf_analyzer(pa, env, target, protocol, model, concurrency, shapes, interval_ms, extra)
    return {**fig, "stalled_before": 1}


def measure(
    pa: Path, env: dict[str, str], targets: list[Target], interval_ms: int, rounds: int = 1
) -> dict[str, Any]:
    """Every step on every target, the targets one after the other within each step (both servers up, so
    that a change in the shared machine's load falls on both sides of a ratio); one that fails is recorded
    with its error (and has no ratio), the others still run. The throughput steps at c32 are measured in
    ``rounds`` rounds, the targets' order reversed every other round: each round's figures are kept under
    ``rounds``, and the step's own figures are those of its median round (see ``_paired``).
    ``{target name: {step: figures}}``."""
    big = {"INPUT0": vs_triton_repo.BIG_ELEMENTS}
    shm = ("--shared-memory", "system", "--output-shared-memory-size", str(4 << 20))
    steps: dict[str, tuple[str, str, int, dict[str, int], tuple[str, ...]]] = {
        "grpc_c32": ("grpc", "add", 32, ADD_SHAPES, ()),
        "grpc_c1": ("grpc", "add", 1, ADD_SHAPES, ()),
        "http_c32": ("http", "add", 32, ADD_SHAPES, ()),
        "http_c1": ("http", "add", 1, ADD_SHAPES, ()),
        "big_c8_shm": ("grpc", "big", 8, big, shm),
        "big_c8_shm_http": ("http", "big", 8, big, shm),
    }
    out: dict[str, Any] = {t.name: {} for t in targets}
    for name, (protocol, model, concurrency, shapes, extra) in steps.items():
        n = rounds if name in PAIRED else 1
        got: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        for r in range(n):
            for target in targets if r % 2 == 0 else targets[::-1]:
                try:
                    fig = _step_with_retry(
                        pa, env, target, protocol, model, concurrency, shapes, interval_ms, extra
                    )
                except subprocess.TimeoutExpired as exc:  # its command names this machine's paths: not kept
                    fig = {"error": f"perf_analyzer did not finish within {exc.timeout:g} s, twice"}
                    print(f"{target.name} {name}: failed: {fig['error']}")
                except RuntimeError as exc:
                    fig = {"error": str(exc)[-600:]}
                    print(f"{target.name} {name}: failed: {str(exc)[:300]}")
                got[target.name].append(fig)
        for target in targets:
            out[target.name][name] = got[target.name][0] if n == 1 else _paired(got, target.name)
    return out


def _paired(got: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    """A step measured in rounds: ``name``'s figures of its median round, and every round's figures under
    ``rounds``. With two targets (zinfer and Triton), the median round is the one whose ratio of throughputs
    is the median of the rounds' own ratios (one round's ratio compares the two sides seconds apart, so a
    slow spell of the machine falls on both); a round where a side failed counts for neither."""
    mine = got[name]
    ok = [i for i in range(len(mine)) if all("throughput_s" in got[k][i] for k in got)]
    if not ok:
        return {**mine[-1], "rounds": mine}
    both = {"triton", "zinfer"} <= got.keys()
    if both:
        key = {i: float(got["zinfer"][i]["throughput_s"] / got["triton"][i]["throughput_s"]) for i in ok}
    else:
        key = {i: float(mine[i]["throughput_s"]) for i in ok}
    ranked = sorted(ok, key=key.__getitem__)
    median = ranked[(len(ranked) - 1) // 2]  # the lower median: an even count never rounds up to a goal
    ratios = [round(key[i], 3) for i in ok] if both else []
    return {**mine[median], "rounds": mine, "round_ratios": ratios, "median_round": median}


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def zinfer_front_door(repository: Path, workers: int, cpus: str | None = None) -> Iterator[Target]:
    """``zinfer serve --grpc --http`` on ``repository``, its front door answering ready (pinned to ``cpus``
    when given: ``--frontdoor-cpus``); stopped by pid."""
    tmp = Path(tempfile.mkdtemp(prefix="zfd-", dir="/tmp"))
    grpc, http = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repository)]
    cmd += ["--runtime-dir", str(tmp / "rt"), "--metrics", "127.0.0.1:0", "--grpc", grpc, "--http", http]
    cmd += ["--frontdoor-workers", str(workers)]
    if cpus is not None:
        cmd += ["--frontdoor-cpus", cpus]
    log_path = tmp / "serve.log"
    proc = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(proc, log_path, 120.0, all_loaded=True)
        deadline = time.monotonic() + 60
        while not all(_ready(f"http://{http}/v2/models/{m}/ready") for m in MODELS):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the front door did not get ready:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        doors = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "zinfer.frontdoor.process" in " ".join(p.cmdline())]  # fmt: skip
        yield Target("zinfer", grpc, http, doors[0].pid if len(doors) == 1 else None,
                     f"ipc://{tmp / 'rt' / 'zinfer.sock'}")  # fmt: skip
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def ratios(triton: dict[str, Any] | None, zinfer: dict[str, Any]) -> dict[str, Any]:
    if triton is None:
        return {}
    out: dict[str, Any] = {}
    for key, (step, field) in STEPS.items():
        if field not in zinfer.get(step, {}) or field not in triton.get(step, {}):
            out[key] = {"error": "a side of this step failed (see its entry)"}
            continue
        z, t = zinfer[step][field], triton[step][field]
        ratio = z / t if t else float("nan")
        goal, better = GOALS[key]
        met = ratio >= goal if better == "higher" else ratio <= goal
        out[key] = {"zinfer": z, "triton": t, "ratio": round(ratio, 3), "goal": goal, "met": bool(met)}
    return out


def report(triton: dict[str, Any] | None, zinfer: dict[str, Any], r: dict[str, Any]) -> None:
    print(f"{'step':26} {'zinfer':>12} {'triton':>12} {'ratio':>8}  goal")
    for key, (step, field) in STEPS.items():
        label = f"{step} {'p50 us' if field == 'p50_us' else '/s'}"
        z = zinfer.get(step, {}).get(field)
        t = (triton or {}).get(step, {}).get(field)
        zs = f"{z:12.1f}" if z is not None else f"{'failed':>12}"
        ts = f"{t:12.1f}" if t is not None else f"{'-':>12}"
        if key not in r or "ratio" not in r[key]:
            print(f"{label:26} {zs} {ts} {'-':>8}")
            continue
        goal, better = GOALS[key]
        sign = ">=" if better == "higher" else "<="
        mark = "met" if r[key]["met"] else "MISSED"
        print(f"{label:26} {zs} {ts} {r[key]['ratio']:8.3f}  {sign} {goal} {mark}")


def _grpc_server() -> str:
    """Which server the gRPC door ran on (frontdoor/grpc_server.py's choice in this environment)."""
    try:
        from zinfer.frontdoor.grpc_server import use_native
    except ImportError:
        return "unknown"
    return "pygrpc-native" if use_native(False) else "grpcio"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--triton-venv", type=Path, help="venv with nvidia-pytriton 0.7.0 and tritonclient[all] 2.51"
    )
    ap.add_argument("--results", type=Path, default=RESULTS, help="where to write (default: tracked file)")
    ap.add_argument("--quick", action="store_true", help="1 s measurement windows instead of 3 s")
    ap.add_argument("--frontdoor-workers", type=int, default=1, help="zinfer's front-door processes")
    ap.add_argument("--rounds", type=int, help="rounds of the throughput steps (default 3 quick, 5 full)")
    ap.add_argument("--frontdoor-cpus", help="zinfer serve --frontdoor-cpus LIST (default: not pinned)")
    args = ap.parse_args()
    p = {**(QUICK if args.quick else FULL)}
    if args.rounds is not None:
        p["rounds"] = max(1, args.rounds)
    busy = _others_running()
    if busy:
        print(
            "another tritonserver or perf_analyzer is running; measure when it is done:\n  "
            + "\n  ".join(busy)
        )
        return 1
    pa = args.triton_venv / "bin" / "perf_analyzer" if args.triton_venv else None
    if pa is None or not pa.exists():
        print("no perf_analyzer (tritonclient 2.51's wheel, see --triton-venv): nothing to measure with")
        return 1
    install = triton_side.find(args.triton_venv)
    env_dir = Path(tempfile.mkdtemp(prefix="zfd-env-"))
    try:
        if install is None:  # perf_analyzer without tritonserver: zinfer's half only
            install = triton_side.TritonInstall(args.triton_venv, args.triton_venv / "bin" / "python", Path())
        env = triton_side._environment(install, env_dir)
        with tempfile.TemporaryDirectory(prefix="zfd-repo-") as tmp:
            repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
            with contextlib.ExitStack() as stack:
                targets = []
                if triton_side.find(args.triton_venv) is not None:
                    s = stack.enter_context(triton_side.serve(install, repo, MODELS))
                    targets.append(Target("triton", s.grpc, s.http))
                else:
                    print("no tritonserver in --triton-venv: zinfer's half only, no ratios")
                door = zinfer_front_door(repo, args.frontdoor_workers, args.frontdoor_cpus)
                target = stack.enter_context(door)
                figures = measure(pa, env, [*targets, target], int(p["interval_ms"]), int(p["rounds"]))
                native = native_client(target.broker_url, 3.0 if args.quick else 6.0)
            triton, zinfer = figures.get("triton"), figures["zinfer"]
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    r = ratios(triton, zinfer)
    report(triton, zinfer, r)
    cpu = door_cpu(zinfer, native)
    for step, fig in cpu.items():
        mark = "met" if fig["met"] else "MISSED"
        door, base, extra = fig["door_us"], fig["native_client_us"], fig["extra_us"]
        print(f"{step} door CPU {door:.0f} us/request, native AsyncClient {base:.0f} us: +{extra:.0f} us "
              f"(goal <= +150) {mark}")  # fmt: skip
    result = {
        "machine": machine(),
        "params": {
            **p,
            "frontdoor_workers": args.frontdoor_workers,
            "frontdoor_cpus": args.frontdoor_cpus,
            "quick": args.quick,
        },
        "triton": triton,
        "zinfer": zinfer,
        "ratios": r,
        "native_client_c32": native,
        "door_cpu": cpu,
        "grpc_server": _grpc_server(),
        "note": None if triton else "zinfer's half only: no tritonserver in --triton-venv",
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
