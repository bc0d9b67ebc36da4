"""What idle models cost the requests of a busy one: the built-in ``add0`` (delay 0) served alone, then
beside N idle models, at concurrency 1 (a sync ``Client``, p50) and 32 (an ``AsyncClient``), with the broker's
CPU per request, beside the bare DEALER -> ROUTER -> DEALER round trip measured in the same run.

The idle models are one-step ensembles over ``add0``: they are real model states of the broker (loaded,
ready, with statistics and metrics) that start no worker process, so hundreds fit on a small machine. The
broker's loop should walk only the models with work each turn, so the figures should not move with N.

Usage: ``.venv/bin/python bench/bench_many_models.py [--idle 0,300] [--seconds 3 | --quick] [--label L]``;
results go to ``bench/results/bench_many_models.json`` (one entry per label).

``--on-demand`` measures on-demand model control instead (issue 35; ``many_models_on_demand.py``): 50 models,
a host budget for 10, Zipf-distributed requests: hit rate, p50/p99 of warm and cold requests, loads per
second. ``--quick`` makes it 10 models, a budget for 4, 100 requests (about a minute on a busy 2-core
machine). Its results go to the same file under ``on_demand`` (one entry per label).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402
from bench_serving import ROOT, bare_frames, machine, pct  # noqa: E402

_IDLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 64
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "S" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "add0" model_version: -1
  input_map {{ key: "INPUT_A" value: "A" }} input_map {{ key: "INPUT_B" value: "B" }}
  output_map {{ key: "OUTPUT_SUM" value: "S" }} }} ] }}
"""


def write_repo(root: Path, idle: int) -> Path:
    vs_triton_repo._model(root, "add0", vs_triton_repo._ADD0_CONFIG, None)
    for i in range(idle):
        vs_triton_repo._model(root, f"idle{i:04d}", _IDLE.format(name=f"idle{i:04d}"), None)
    return root


def measure(idle: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zbm-") as tmp:
        repo = write_repo(Path(tmp) / "repo", idle)
        with z.serve(repo) as s:
            c1 = z.sync_latency(s, "add0", seconds, 1_000_000)
            c32 = z.async_closed(s, "add0", 32, seconds, 1_000_000)
    return {"idle_models": idle, "add0_c1_sync": c1, "add0_c32_async": c32}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--idle", default="0,300", help="idle model counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--label", default="main")
    ap.add_argument("--quick", action="store_true", help="1 s per load (--on-demand: a small workload)")
    ap.add_argument("--on-demand", action="store_true", help="on-demand model control under a memory budget")
    ap.add_argument("--models", type=int, default=50, help="--on-demand: models in the repository")
    ap.add_argument("--slots", type=int, default=10, help="--on-demand: instances the budget holds")
    ap.add_argument("--requests", type=int, default=1500, help="--on-demand: requests in all")
    ap.add_argument("--concurrency", type=int, default=2, help="--on-demand: closed-loop clients")
    ap.add_argument("--zipf", type=float, default=1.0, help="--on-demand: Zipf exponent of model popularity")
    args = ap.parse_args()
    if args.on_demand:
        return on_demand(args)
    if args.quick:
        args.seconds = 1.0
    t0 = time.monotonic()
    with baseline.bare_hop() as ep:
        lats = baseline.bare_latency_us(ep, bare_frames(), 3000)
    bare_p50 = pct(lats, 50)
    rows = [measure(int(n), args.seconds) for n in args.idle.split(",")]
    print(f"bare DEALER->ROUTER->DEALER round trip: p50 {bare_p50:.0f} us")
    print("idle models   c1 p50 us  /bare   broker us/req c1   c32 req/s   broker us/req c32")
    for r in rows:
        a, b = r["add0_c1_sync"], r["add0_c32_async"]
        print(f"{r['idle_models']:>11}   {a['p50_us']:>9.0f}  {a['p50_us'] / bare_p50:>5.2f}"
              f"   {a['cpu_per_request']['broker_us']:>16.1f}   {b['throughput_s']:>9.0f}"
              f"   {b['cpu_per_request']['broker_us']:>17.1f}")  # fmt: skip
    out = ROOT / "bench" / "results" / "bench_many_models.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data[args.label] = {"machine": machine(), "bare_p50_us": round(bare_p50, 1), "rows": rows}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written: {out} (label {args.label}), {time.monotonic() - t0:.0f} s")
    return 0 if all(r[k]["errors"] == 0 for r in rows for k in ("add0_c1_sync", "add0_c32_async")) else 1


def on_demand(args: argparse.Namespace) -> int:
    import many_models_on_demand as od

    if args.quick:
        args.models, args.slots, args.requests = 10, 4, 100
    t0 = time.monotonic()
    r = od.run(args.models, args.slots, args.requests, args.concurrency, args.zipf)
    print(od.report(r))
    out = ROOT / "bench" / "results" / "bench_many_models.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("on_demand", {})[args.label] = r
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written: {out} (on_demand, label {args.label}), {time.monotonic() - t0:.0f} s")
    return 0 if r["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
