"""zinfer's KServe v2 front door against Triton 2.51, measured by perf_analyzer on both, in one run.

One Triton model repository (``vs_triton_repo.py``: the ``TritonPythonModel`` ``add``, max_batch_size 64,
preferred [16, 32, 64], delay 500 µs; ``big``, 4 MiB in and out) is served by Triton (``tritonserver`` from
the pip wheels, see ``triton_side.py``) and then by ``zinfer serve --grpc --http`` (its front door), each
measured by the same ``perf_analyzer`` binary (tritonclient 2.51's):

* ``add`` at concurrency 32: throughput over gRPC and over HTTP;
* ``add`` at concurrency 1: p50 latency over gRPC and over HTTP;
* ``big`` (4 MiB) at concurrency 8 with ``--shared-memory system``: throughput over gRPC and over HTTP.

Ratios, zinfer / Triton, against the issue's goals: gRPC and HTTP throughput at c32 >= 1.0, p50 at c1
<= 1.2, big with system shared memory >= 1.5. A step that fails is recorded with its error. Every step is
bounded (perf_analyzer's measurement windows and trials, a timeout per call); every server is stopped by
its pid.

Usage: ``.venv/bin/python bench/bench_frontdoor.py --triton-venv DIR [--quick] [--frontdoor-workers N]``.
Without a Triton install (no ``--triton-venv``, or no Triton there) nothing can drive the load: perf_analyzer
comes from the same wheel. With perf_analyzer but no tritonserver, only zinfer's half runs, and it says so.
Results: bench/results/bench_frontdoor.json (replaced by each run).
"""

from __future__ import annotations

import argparse
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
FULL = {"interval_ms": 3000}
QUICK = {"interval_ms": 1000}
GOALS = {  # (key, goal, "higher" or "lower" is better)
    "grpc_c32_throughput": (1.0, "higher"),
    "http_c32_throughput": (1.0, "higher"),
    "grpc_c1_p50": (1.2, "lower"),
    "http_c1_p50": (1.2, "lower"),
    "big_c8_shm_throughput": (1.5, "higher"),
    "big_c8_shm_http_throughput": (1.5, "higher"),
}
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
            run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)
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
                }
            errors.append(f"({run.returncode}) {run.stdout[-1500:]}{run.stderr[-1500:]}")
    raise RuntimeError(f"perf_analyzer failed on {target.name} {protocol} {model}:\n" + "\n".join(errors))


def measure(pa: Path, env: dict[str, str], target: Target, interval_ms: int) -> dict[str, Any]:
    """Every step; one that fails is recorded with its error (and has no ratio), the others still run."""
    add = {"INPUT_A": 1, "INPUT_B": 1}
    big = {"INPUT0": vs_triton_repo.BIG_ELEMENTS}
    shm = ("--shared-memory", "system", "--output-shared-memory-size", str(4 << 20))
    steps: dict[str, tuple[str, str, int, dict[str, int], tuple[str, ...]]] = {
        "grpc_c32": ("grpc", "add", 32, add, ()),
        "grpc_c1": ("grpc", "add", 1, add, ()),
        "http_c32": ("http", "add", 32, add, ()),
        "http_c1": ("http", "add", 1, add, ()),
        "big_c8_shm": ("grpc", "big", 8, big, shm),
        "big_c8_shm_http": ("http", "big", 8, big, shm),
    }
    out: dict[str, Any] = {}
    for name, (protocol, model, concurrency, shapes, extra) in steps.items():
        try:
            out[name] = perf_analyzer(
                pa, env, target, protocol, model, concurrency, shapes, interval_ms, extra
            )
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            out[name] = {"error": str(exc)[-600:]}
            print(f"{target.name} {name}: failed: {str(exc)[:300]}")
    return out


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def zinfer_front_door(repository: Path, workers: int) -> Iterator[Target]:
    """``zinfer serve --grpc --http`` on ``repository``, its front door answering ready; stopped by pid."""
    tmp = Path(tempfile.mkdtemp(prefix="zfd-", dir="/tmp"))
    grpc, http = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repository)]
    cmd += ["--runtime-dir", str(tmp / "rt"), "--metrics", "127.0.0.1:0", "--grpc", grpc, "--http", http]
    cmd += ["--frontdoor-workers", str(workers)]
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
        yield Target("zinfer", grpc, http)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def ratios(triton: dict[str, Any] | None, zinfer: dict[str, Any]) -> dict[str, Any]:
    if triton is None:
        return {}
    out = {}
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--triton-venv", type=Path, help="venv with nvidia-pytriton 0.7.0 and tritonclient[all] 2.51"
    )
    ap.add_argument("--quick", action="store_true", help="1 s measurement windows instead of 3 s")
    ap.add_argument("--frontdoor-workers", type=int, default=1, help="zinfer's front-door processes")
    args = ap.parse_args()
    p = QUICK if args.quick else FULL
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
            triton = None
            if triton_side.find(args.triton_venv) is not None:
                with triton_side.serve(install, repo, MODELS) as s:
                    triton = measure(pa, env, Target("triton", s.grpc, s.http), int(p["interval_ms"]))
            else:
                print("no tritonserver in --triton-venv: zinfer's half only, no ratios")
            with zinfer_front_door(repo, args.frontdoor_workers) as target:
                zinfer = measure(pa, env, target, int(p["interval_ms"]))
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    r = ratios(triton, zinfer)
    report(triton, zinfer, r)
    result = {
        "machine": machine(),
        "params": {**p, "frontdoor_workers": args.frontdoor_workers, "quick": args.quick},
        "triton": triton,
        "zinfer": zinfer,
        "ratios": r,
        "note": None if triton else "zinfer's half only: no tritonserver in --triton-venv",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
