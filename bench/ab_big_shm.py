"""``big`` (4 MiB in and out) at concurrency 8 with system shared memory: Triton and zinfer front-door
variants all up at once, measured in turns by perf_analyzer, round after round (the order reversed every
other round), as bench_frontdoor.py's ``big_c8_shm_http`` step: each variant's throughput over Triton's in
the same round, and the CPU per request of every process of its server (door, broker, workers; Triton's
one process) over the same window.

A variant is ``NAME`` or ``NAME:KEY=VALUE,...`` (the environment its ``zinfer serve`` starts with, e.g.
``PYTHONPATH=DIR`` for another tree, see ab_frontdoor_http.py). Keep runs short on shared cores.

Usage: ``.venv/bin/python bench/ab_big_shm.py --triton-venv DIR --variant branch
[--variant main:PYTHONPATH=DIR] [--rounds 3] [--protocol http]``. Results: bench/results/ab_big_shm.json
(``--results PATH`` for another file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from ab_frontdoor_http import _environment, _variant  # noqa: E402
from bench_frontdoor import Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ab_big_shm.json"
SHM = ("--shared-memory", "system", "--output-shared-memory-size", str(4 << 20))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu(procs: list[psutil.Process]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in procs:
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        role = (
            "door" if "frontdoor.process" in cmd else "worker" if "zinfer.workers" in cmd
            else "broker" if "zinfer.broker" in cmd else "triton" if "tritonserver" in cmd
            else "triton_stub" if "triton_python_backend_stub" in cmd else "other"
        )  # fmt: skip
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--protocol", default="http", choices=("http", "grpc"))
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    if install is None:
        print("no tritonserver in --triton-venv")
        return 1
    pa = args.triton_venv / "bin" / "perf_analyzer"
    shapes = {"INPUT0": vs_triton_repo.BIG_ELEMENTS}
    rows: dict[str, list[dict[str, Any]]] = {}
    env_dir = Path(tempfile.mkdtemp(prefix="zbig-env-"))
    try:
        env = triton_side._environment(install, env_dir)
        with tempfile.TemporaryDirectory(prefix="zbig-") as tmp, contextlib.ExitStack() as stack:
            repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
            s = stack.enter_context(triton_side.serve(install, repo, ("big",)))
            targets: list[tuple[str, Target, int | None]] = [
                ("triton", Target("triton", s.grpc, s.http), s.pid)
            ]
            for text in args.variant:
                name, extra = _variant(text)
                with _environment(extra):
                    t = stack.enter_context(zinfer_front_door(repo, 1))
                root = psutil.Process(t.door_pid).parent() if t.door_pid else None
                targets.append((name, t, root.pid if root else None))
            rows = {name: [] for name, _, _ in targets}
            for r in range(args.rounds):
                order = targets if r % 2 == 0 else targets[::-1]
                for name, target, pid in order:
                    procs = _tree(pid) if pid else []
                    c0, t0 = _cpu(procs), time.monotonic()
                    try:
                        fig = perf_analyzer(
                            pa, env, target, args.protocol, "big", 8, shapes, args.interval_ms, SHM
                        )
                    except Exception as exc:  # noqa: BLE001 - recorded, the others still run
                        fig = {"error": str(exc)[-300:]}
                    c1, t1 = _cpu(procs), time.monotonic()
                    rate = fig.get("throughput_s", 0.0)
                    if rate:
                        n = rate * (t1 - t0)
                        fig["cpu_us_per_request"] = {
                            k: round(1e6 * (c1[k] - c0.get(k, 0.0)) / n, 1) for k in c1
                        }
                    rows[name].append(fig)
                    print(f"round {r} {name:10s} {rate:8.1f}/s p50 {fig.get('p50_us', 0):8.0f} us "
                          f"cpu/req {fig.get('cpu_us_per_request', {})}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    summary: dict[str, Any] = {}
    for name, figs in rows.items():
        per_round = []
        for i, f in enumerate(figs):
            tri = rows["triton"][i].get("throughput_s") if i < len(rows["triton"]) else None
            if "throughput_s" in f and tri:
                per_round.append(f["throughput_s"] / tri)
        ok = [f["throughput_s"] for f in figs if "throughput_s" in f]
        summary[name] = {
            "throughput_s_median": round(statistics.median(ok), 1) if ok else None,
            "ratio_to_triton_per_round": [round(x, 3) for x in per_round],
            "ratio_to_triton_median": round(statistics.median(per_round), 3) if per_round else None,
        }
        fig = summary[name]
        print(f"{name:10s} median {fig['throughput_s_median']}/s, x Triton per round "
              f"{fig['ratio_to_triton_per_round']} median {fig['ratio_to_triton_median']}")  # fmt: skip
    out = {"machine": machine(), "variants": args.variant, "protocol": args.protocol, "rounds": rows,
           "summary": summary}  # fmt: skip
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
