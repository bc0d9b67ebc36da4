"""Client benchmark on ``add``: one process's AsyncClient vs threaded Client, then a ``zinfer perf`` curve.

(a) throughput of one ``AsyncClient`` with 256 requests in flight (tasks on one loop) vs one ``Client``
shared by 32 threads, on the same server, one after the other, each for a bounded duration, both through
the ``zinfer perf`` load engine;
(b) ``zinfer perf`` on ``add`` at concurrency 1, 2, 4, ... 64 (threads), saved as bench/results/perf_add.csv
and bench/results/perf_add.json.

Usage: ``.venv/bin/python bench/bench_clients.py [--quick]``. Results go to bench/results/bench_clients.json.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.client import AsyncClient, Client
from zinfer.tools import perf_cli
from zinfer.tools.perf_load import Step, Tally, run_async, run_sync
from zinfer.tools.perf_report import StepResult, summarize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROOT, machine, zinfer_server  # noqa: E402

RESULTS = ROOT / "bench" / "results"
FULL = {"step_s": 5.0, "step_max": 500_000, "perf_s": 3.0}
QUICK = {"step_s": 1.5, "step_max": 100_000, "perf_s": 1.0}
ASYNC_CONCURRENCY = 256
SYNC_THREADS = 32
PERF_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


def _inputs() -> dict[str, np.ndarray]:
    return {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.full((1, 1), 2.0, np.float32)}


def _figures(r: StepResult) -> dict[str, Any]:
    keep = ("requests", "errors", "duration_s", "throughput_infer_s", "p50_us", "p99_us", "mean_batch")
    return {k: getattr(r, k) for k in keep}


async def async_step(url: str, seconds: float, max_requests: int) -> StepResult:
    async with AsyncClient(url, timeout=30.0) as client:
        inputs = _inputs()

        async def call() -> object:
            return await client.infer("add", inputs)

        for _ in range(200):
            await call()
        step = Step(concurrency=ASYNC_CONCURRENCY, interval_s=seconds, max_requests=max_requests)
        tally = Tally()
        before = await client.statistics("add")
        await run_async(call, step, tally)
        return summarize(step, tally, before, await client.statistics("add"), "add", 1)


def sync_step(url: str, seconds: float, max_requests: int) -> StepResult:
    with Client(url, timeout=30.0) as client:
        inputs = _inputs()

        def call() -> object:
            return client.infer("add", inputs)

        for _ in range(200):
            call()
        step = Step(concurrency=SYNC_THREADS, interval_s=seconds, max_requests=max_requests)
        tally = Tally()
        before = client.statistics("add")
        run_sync(call, step, tally, SYNC_THREADS)
        return summarize(step, tally, before, client.statistics("add"), "add", 1)


def perf_curve(url: str, seconds: float) -> list[dict[str, Any]]:
    """``zinfer perf`` once per concurrency (its ranges are linear), merged into one CSV and one JSON."""
    steps: list[dict[str, Any]] = []
    run: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zbc-") as tmp:
        for c in PERF_CONCURRENCY:
            out = Path(tmp) / f"c{c}.json"
            argv = ["-m", "add", "-u", url, "--concurrency-range", str(c)]
            argv += ["--measurement-interval", str(seconds), "--json", str(out), "-q"]
            code = perf_cli.main(argv)
            if code != 0:
                raise RuntimeError(f"zinfer perf failed at concurrency {c} (exit {code})")
            doc = json.loads(out.read_text())
            steps += doc.pop("steps")
            run = doc
    fields = [f.name for f in dataclasses.fields(StepResult)]
    with open(RESULTS / "perf_add.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for s in steps:
            writer.writerow({k: "" if s[k] is None else s[k] for k in fields})
    (RESULTS / "perf_add.json").write_text(json.dumps({**run, "steps": steps}, indent=2) + "\n")
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="short steps (about half a minute in all)")
    p = QUICK if ap.parse_args().quick else FULL
    RESULTS.mkdir(parents=True, exist_ok=True)
    with zinfer_server() as url:
        a = asyncio.run(async_step(url, p["step_s"], int(p["step_max"])))
        s = sync_step(url, p["step_s"], int(p["step_max"]))
        print(f"\n(a) one process on add, {p['step_s']:g} s each")
        for label, r in (
            (f"AsyncClient, {ASYNC_CONCURRENCY} tasks", a),
            (f"Client, {SYNC_THREADS} threads", s),
        ):
            print(
                f"  {label:<26} {r.throughput_infer_s:>9.0f} infer/s  p50 {r.p50_us:>7.0f} us  "
                f"p99 {r.p99_us:>7.0f} us  mean batch {r.mean_batch:>5.2f}  errors {r.errors}"
            )
        ratio = a.throughput_infer_s / s.throughput_infer_s if s.throughput_infer_s else 0.0
        print(f"  async / threaded throughput: {ratio:.2f}x\n")
        print(f"(b) zinfer perf on add, concurrency {','.join(map(str, PERF_CONCURRENCY))}")
        curve = perf_curve(url, p["perf_s"])
    doc = {
        "mode": "quick" if p is QUICK else "full",
        "params": p,
        "machine": machine(),
        "async_vs_threads": {
            "async": {"concurrency": ASYNC_CONCURRENCY, **_figures(a)},
            "threads": {"threads": SYNC_THREADS, **_figures(s)},
            "async_over_threads": round(ratio, 3),
        },
        "perf_add": [
            {
                k: st[k]
                for k in ("concurrency", "throughput_infer_s", "p50_us", "p99_us", "mean_batch", "errors")
            }
            for st in curve
        ],
        "perf_files": ["bench/results/perf_add.csv", "bench/results/perf_add.json"],
    }
    (RESULTS / "bench_clients.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwritten: {RESULTS / 'bench_clients.json'}, perf_add.csv, perf_add.json")
    return 0 if not (a.errors or s.errors) else 1


if __name__ == "__main__":
    sys.exit(main())
