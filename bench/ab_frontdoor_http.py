"""A/B of front-door variants over HTTP (or gRPC, ``--protocol grpc``), all up at once and measured in
turns: perf_analyzer on ``add`` at concurrency 32 (and 1), round after round, each variant's door CPU per
request (its CPU time over the requests perf_analyzer counted in the same window) and throughput (and p50
at c1).

A variant is ``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE``: the environment its ``zinfer serve`` starts with
(``ZINFER_FRONTDOOR_LOOP=asyncio`` for asyncio's event loop, ``ZINFER_FRONTDOOR_SHORTCUT=1`` to answer
without the broker, ``PYTHONPATH=DIR`` for another tree's code: a symlink tree ``DIR/zinfer/{client,...}``).
``--case big``: the ``big`` model (4 MiB in and out) at concurrency 8 with system shared memory instead
(``--c1``: ``big`` at 1, without shared memory). On a shared machine, compare variants within a round,
and the medians over rounds.

Usage: ``.venv/bin/python bench/ab_frontdoor_http.py --triton-venv DIR --variant new --variant
old:ZINFER_FRONTDOOR_LOOP=asyncio [--rounds 4] [--c1] [--case big]``. Results:
bench/results/ab_frontdoor_http.json (``--results PATH`` for another file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402
from profile_frontdoor import CASES  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ab_frontdoor_http.json"


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, env


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Any:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--triton-venv", type=Path, required=True, help="perf_analyzer's venv")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--interval-ms", type=int, default=1500)
    ap.add_argument("--c1", action="store_true", help="also concurrency 1 (p50)")
    ap.add_argument("--protocol", default="http", choices=("http", "grpc"))
    ap.add_argument("--case", default="c32", choices=sorted(CASES), help="big: 4 MiB, c8, system shm")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    args = ap.parse_args()
    model, concurrency, shapes, extra = CASES[args.case]
    pa = args.triton_venv / "bin" / "perf_analyzer"
    install = triton_side.find(args.triton_venv) or triton_side.TritonInstall(
        args.triton_venv, args.triton_venv / "bin" / "python", Path()
    )
    variants = [_variant(v) for v in args.variant]
    steps = [(args.case, concurrency)] + ([("c1", 1)] if args.c1 else [])
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {n: {s: [] for s, _ in steps} for n, _ in variants}
    env_dir = Path(tempfile.mkdtemp(prefix="zab-env-"))
    try:
        env = triton_side._environment(install, env_dir)
        with tempfile.TemporaryDirectory(prefix="zab-") as tmp, contextlib.ExitStack() as stack:
            repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
            targets: list[tuple[str, Target]] = []
            for name, extra in variants:
                with _environment(extra):
                    targets.append((name, stack.enter_context(zinfer_front_door(repo, 1))))
            for r in range(args.rounds):
                order = targets if r % 2 == 0 else targets[::-1]
                for step, conc in steps:
                    for name, target in order:
                        try:
                            fig = perf_analyzer(
                                pa, env, target, args.protocol, model, conc, shapes, args.interval_ms,
                                extra if conc == concurrency else (),
                            )  # fmt: skip
                        except Exception as exc:  # noqa: BLE001 - recorded, the others still run
                            fig = {"error": str(exc)[-300:]}
                        rows[name][step].append(fig)
                        print(f"round {r} {step} {name:12s} {fig.get('throughput_s', 0):8.0f}/s "
                              f"p50 {fig.get('p50_us', 0):7.0f} us  door cpu "
                              f"{fig.get('door_cpu_us_per_request', '-')} us/req", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    summary: dict[str, Any] = {}
    for name, by_step in rows.items():
        for step, figs in by_step.items():
            ok = [f for f in figs if "throughput_s" in f]
            if not ok:
                continue
            summary[f"{name} {step}"] = {
                "throughput_s": round(statistics.median(f["throughput_s"] for f in ok), 1),
                "p50_us": round(statistics.median(f["p50_us"] for f in ok), 1),
                "door_cpu_us_per_request": round(
                    statistics.median(f.get("door_cpu_us_per_request", 0.0) for f in ok), 1
                ),
            }
    for key, fig in summary.items():
        print(f"median {key:18s} {fig['throughput_s']:8.0f}/s p50 {fig['p50_us']:7.0f} us "
              f"door cpu {fig['door_cpu_us_per_request']} us/req")  # fmt: skip
    out = {
        "machine": machine(),
        "variants": args.variant,
        "case": args.case,
        "rounds": rows,
        "median": summary,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
