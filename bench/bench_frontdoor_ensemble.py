"""The seed's own workload through the gRPC door: a three-step text ensemble driven by one
``tritonclient.grpc.aio`` client with 32 requests in flight, against Triton 2.51 and against zinfer's door.

One Triton model repository (``vs_triton_repo.py``'s ``text_ensemble``: tokenizer → lm → detokenizer, each a
``TritonPythonModel``; lm batched with preferred [4, 8, 16], delay 5 ms) is served by Triton (``tritonserver``
from the pip wheels, ``triton_side.py``) and by ``zinfer serve --grpc`` (its front door), both up at once.
The same client script, run by the same interpreter (the Triton venv's, tritonclient 2.51, when given), is
pointed at each in turns (Triton, zinfer, Triton, zinfer, ...) so that the shared machine's load falls on
both sides of the ratio. Each turn: one ``InferenceServerClient`` (grpc.aio), 32 coroutines each sending
one-string requests in a closed loop for ``--seconds``, every answer checked against the expected text.

Printed per turn and kept in the results: throughput, p50/p99, the client's CPU per request, and the
server's CPU per request split by process: Triton (tritonserver and its python-backend stubs), zinfer (the
door, the broker, the workers). Goal of issue 33: zinfer / Triton throughput >= 1.0 (median of the turns'
ratios).

Usage: ``.venv/bin/python bench/bench_frontdoor_ensemble.py --triton-venv DIR [--rounds N] [--seconds S]
[--compiled [--build PATH]]``. ``--compiled`` serves zinfer's side (broker, door, workers) from a
mypyc-compiled build of this checkout, as the goals are judged (``bench_compiled.build_compiled``; ``--build``
reuses one it made: the folder it returned). Without tritonserver in ``--triton-venv`` only zinfer's turns
run. Results: bench/results/bench_frontdoor_ensemble.json (one entry per ``--label``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bench_frontdoor_ensemble.json"
ENSEMBLE = ("tokenizer", "lm", "detokenizer", "text_ensemble")
IN_FLIGHT = 32

# the closed loops, timed, and the figures printed as JSON: the tail of every client script here
LOOP = r"""    for _ in range(20):  # warm: connection, model lookups, the lm's batcher
        await asyncio.gather(*(one_call() for _ in range(4)))
    lats = []
    end = 0.0
    async def loop():
        while time.monotonic() < end:
            t0 = time.perf_counter()
            await one_call()
            lats.append(time.perf_counter() - t0)
    c0, t0 = time.process_time(), time.monotonic()
    end = t0 + seconds
    await asyncio.gather(*(loop() for _ in range(in_flight)))
    c1, t1 = time.process_time(), time.monotonic()
    await client.close()
    lats.sort()
    n = len(lats)
    print(json.dumps({"requests": n, "wall_s": t1 - t0, "throughput_s": n / (t1 - t0),
        "p50_us": lats[n // 2] * 1e6, "p99_us": lats[int(n * 0.99)] * 1e6,
        "client_cpu_us_per_request": 1e6 * (c1 - c0) / n, "errors": errors}))

asyncio.run(main())
"""

CLIENT = r"""
import asyncio, json, sys, time
import numpy as np
import tritonclient.grpc.aio as grpcclient

url, text, expected = sys.argv[1], sys.argv[4], sys.argv[5]
seconds, in_flight = float(sys.argv[2]), int(sys.argv[3])

async def main():
    client = grpcclient.InferenceServerClient(url)
    def request():
        t = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        return [t], [grpcclient.InferRequestedOutput("RESULT")]
    errors = 0
    async def one_call():
        nonlocal errors
        inputs, outputs = request()
        r = await client.infer("text_ensemble", inputs, outputs=outputs)
        if r.as_numpy("RESULT").reshape(-1)[0] != expected.encode():
            errors += 1
""" + LOOP


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _role(p: psutil.Process, root_pid: int, side: str) -> str:
    if side == "triton":
        return "tritonserver" if p.pid == root_pid else "stubs"
    cmd = " ".join(p.cmdline())
    if "zinfer.frontdoor.process" in cmd:
        return "door"
    return "broker" if p.pid == root_pid else "workers"


def _cpu_by_role(procs: list[psutil.Process], root_pid: int, side: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in procs:
        try:
            t = p.cpu_times()
            role = _role(p, root_pid, side)
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def turn(python: Path, url: str, seconds: float, root_pid: int, side: str) -> dict[str, Any]:
    """One client run against ``url``; the server tree's CPU per request by role over the same run."""
    procs = _tree(root_pid)
    cpu0 = _cpu_by_role(procs, root_pid, side)
    args = [str(python), "-c", CLIENT, url, str(seconds), str(IN_FLIGHT),
            vs_triton_repo.TEXT.decode(), vs_triton_repo.EXPECTED.decode()]  # fmt: skip
    run = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120, check=False)
    cpu1 = _cpu_by_role(procs, root_pid, side)
    if run.returncode != 0:
        return {"error": run.stderr[-1500:]}
    fig: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    # the server's CPU over the client's whole run (its warm-up included) per measured request: an upper
    # bound, the same for both sides
    n = max(1, int(fig["requests"]))
    fig["server_cpu_us_per_request"] = {
        role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / n, 1) for role in sorted(cpu1)
    }
    for key in ("throughput_s", "p50_us", "p99_us", "client_cpu_us_per_request", "wall_s"):
        fig[key] = round(float(fig[key]), 1)
    return fig


def _line(side: str, fig: dict[str, Any]) -> str:
    if "error" in fig:
        return f"  {side:7} failed: {fig['error'][-300:]}"
    cpu = " ".join(f"{k} {v:.0f}" for k, v in fig["server_cpu_us_per_request"].items())
    rate = f"{fig['throughput_s']:8.1f}/s  p50 {fig['p50_us']:8.0f} us  p99 {fig['p99_us']:8.0f} us"
    client = f"client {fig['client_cpu_us_per_request']:.0f} us/req"
    return f"  {side:7} {rate}  errors {fig['errors']}  {client}  server us/req: {cpu}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, help="venv with nvidia-pytriton 0.7.0 and tritonclient 2.51")
    ap.add_argument("--rounds", type=int, default=3, help="turns per server")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each turn")
    ap.add_argument("--label", default="latest", help="the results entry to write")
    ap.add_argument("--compiled", action="store_true", help="zinfer's side on a mypyc-compiled build")
    ap.add_argument("--build", type=Path, help="with --compiled: a build made before (its PYTHONPATH folder)")
    ap.add_argument("--frontdoor-cpus", help="zinfer serve --frontdoor-cpus LIST (default: not pinned)")
    args = ap.parse_args()
    if args.compiled and COMPILED_ENV not in os.environ:
        return _rerun_compiled(args.build)
    install = triton_side.find(args.triton_venv)
    python = install.python if install is not None else Path(sys.executable)
    turns: dict[str, list[dict[str, Any]]] = {"triton": [], "zinfer": []}
    with tempfile.TemporaryDirectory(prefix="zfe-repo-") as tmp, contextlib.ExitStack() as stack:
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
        sides: list[tuple[str, str, int]] = []
        if install is not None:
            s = stack.enter_context(triton_side.serve(install, repo, ENSEMBLE))
            sides.append(("triton", s.grpc, s.pid))
        else:
            print("no tritonserver in --triton-venv: zinfer's turns only, no ratio")
        target = stack.enter_context(zinfer_front_door(repo, 1, args.frontdoor_cpus))
        assert target.door_pid is not None
        sides.append(("zinfer", target.grpc, psutil.Process(target.door_pid).ppid()))
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}")
            for side, url, pid in sides:
                fig = turn(python, url, args.seconds, pid, side)
                turns[side].append(fig)
                print(_line(side, fig))
    ok = {k: [f for f in v if "error" not in f] for k, v in turns.items()}
    both = [(t, z) for t, z in zip(turns["triton"], turns["zinfer"], strict=False)
            if "error" not in t and "error" not in z and t["throughput_s"] and t["p50_us"]]  # fmt: skip
    pairs = [z["throughput_s"] / t["throughput_s"] for t, z in both]
    p50s = [z["p50_us"] / t["p50_us"] for t, z in both]
    summary: dict[str, Any] = {
        "throughput_ratios": [round(x, 3) for x in pairs],
        "median_throughput_ratio": round(statistics.median(pairs), 3) if pairs else None,
        "median_p50_ratio": round(statistics.median(p50s), 3) if p50s else None,
        "goal": ">= 1.0",
    }
    for side, figs in ok.items():
        if figs:
            roles = sorted({k for f in figs for k in f["server_cpu_us_per_request"]})
            summary[f"{side}_median_server_cpu_us_per_request"] = {
                k: round(statistics.median(f["server_cpu_us_per_request"].get(k, 0.0) for f in figs), 1)
                for k in roles
            }
    if pairs:
        met = "met" if summary["median_throughput_ratio"] >= 1.0 else "MISSED"
        median, p50 = summary["median_throughput_ratio"], summary["median_p50_ratio"]
        print(f"zinfer/Triton throughput per round {summary['throughput_ratios']}, median {median} "
              f"(goal >= 1.0) {met}; p50 {p50}")  # fmt: skip
    for side in ok:
        key = f"{side}_median_server_cpu_us_per_request"
        if key in summary:
            print(f"{side} server CPU us/request (median): {summary[key]}")
    doc: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.setdefault("runs", {})[args.label] = {
        "machine": machine(),
        "params": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "in_flight": IN_FLIGHT,
            "client": f"tritonclient.grpc.aio run by {python.parent.parent.name}'s python",
            "grpc_server": _grpc_server(),
            "build": "compiled" if COMPILED_ENV in os.environ else "pure",
            "frontdoor_cpus": args.frontdoor_cpus,
        },  # fmt: skip
        "turns": turns,
        "summary": summary,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written: {RESULTS.relative_to(ROOT)} (label {args.label})")
    errors = sum(int(f.get("errors", 0)) for figs in ok.values() for f in figs)
    return 1 if errors or any("error" in f for v in turns.values() for f in v) else 0


COMPILED_ENV = "ZINFER_BENCH_COMPILED"  # set in the child of --compiled, whose zinfer is the compiled build


def _rerun_compiled(build: Path | None) -> int:
    """This script again, in a child whose zinfer (and so the server it starts) is the compiled build."""
    from bench_compiled import build_compiled

    work = Path(tempfile.mkdtemp(prefix="zfe-build-"))
    try:
        path = build if build is not None else build_compiled(work)
        env = {**os.environ, "PYTHONPATH": str(path), COMPILED_ENV: "1"}
        script = str(Path(__file__).resolve())
        return subprocess.call([sys.executable, script, *sys.argv[1:]], env=env, cwd="/")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _grpc_server() -> str:
    try:
        from zinfer.frontdoor.grpc_server import use_native
    except ImportError:
        return "unknown"
    return "pygrpc-native" if use_native(False) else "grpcio"


if __name__ == "__main__":
    sys.exit(main())
