"""Ensemble benchmark: the bundled text pipeline run by the broker vs the same three models called one
after another by the client.

Server: ``zinfer serve`` on a repository of only ``tokenizer``, ``rot13``, ``detokenizer`` and the
``text_pipeline`` ensemble over them (one CPU instance each, dynamic batching). Load: one process, one
``AsyncClient``, ``concurrency`` tasks in closed loops for a bounded time and count; each request is one
short sentence (shape [1, 1], TYPE_STRING).

* ensemble: ``text_pipeline`` once per request: the broker runs the three steps, the tensors between them
  stay in the server's shared memory;
* chained: ``tokenizer``, then ``rot13`` on its tokens, then ``detokenizer`` on those: three round trips,
  the intermediate tensors travel to the client and back.

Raw limit in the same run: a bare ZeroMQ round trip through one ROUTER hop (``baseline.py``), one message
in flight and ``concurrency`` in flight; a request that makes three hops cannot beat a third of that rate.

Usage: ``.venv/bin/python bench/bench_ensemble.py [--quick]``. Results go to
bench/results/bench_ensemble.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.client import AsyncClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from bench_serving import ROOT, bare_frames, machine, pct, zinfer_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bench_ensemble.json"
MODELS = ("tokenizer", "rot13", "detokenizer", "text_pipeline")
FULL = {"seconds": 10.0, "max_requests": 200_000, "bare_n": 5000}
QUICK = {"seconds": 3.0, "max_requests": 50_000, "bare_n": 1000}
CONCURRENCY = (1, 32)
TIMEOUT_S = 30.0
TEXT = np.array([[b"The quick brown fox jumps over the lazy dog, 42 times."]], dtype=object)
EXPECTED = b"Gur dhvpx oebja sbk whzcf bire gur ynml qbt, 42 gvzrf."


async def _ensemble(c: AsyncClient) -> bytes:
    out = (await c.infer("text_pipeline", {"TEXT": TEXT})).as_numpy("RESULT")
    return bytes(out[0, 0])


async def _chained(c: AsyncClient) -> bytes:
    tokens = (await c.infer("tokenizer", {"TEXT": TEXT})).as_numpy("TOKENS")
    rotated = (await c.infer("rot13", {"TOKENS": tokens})).as_numpy("TOKENS_OUT")
    out = (await c.infer("detokenizer", {"TOKENS": rotated})).as_numpy("TEXT")
    return bytes(out[0, 0])


async def _closed_loops(url: str, mode: str, concurrency: int, seconds: float, cap: int) -> dict[str, Any]:
    call = _ensemble if mode == "ensemble" else _chained
    latencies: list[float] = []
    async with AsyncClient(url, timeout=TIMEOUT_S) as c:
        for _ in range(3):  # warm up: metadata, arenas, the workers' first batches
            assert await call(c) == EXPECTED
        stop = time.perf_counter() + seconds
        per_task = max(1, cap // concurrency)

        async def loop() -> None:
            for _ in range(per_task):
                if time.perf_counter() >= stop:
                    return
                t0 = time.perf_counter()
                got = await call(c)
                latencies.append((time.perf_counter() - t0) * 1e6)
                if got != EXPECTED:
                    raise AssertionError(f"{mode}: wrong answer {got!r}")

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "mode": mode,
        "concurrency": concurrency,
        "requests": len(latencies),
        "seconds": elapsed,
        "req_per_s": len(latencies) / elapsed,
        "p50_us": pct(latencies, 50),
        "p99_us": pct(latencies, 99),
    }


def run(p: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="zbe-"))
    try:
        repo = tmp / "models"
        for name in MODELS:
            shutil.copytree(ROOT / "configs" / "models" / name, repo / name)
        frames = bare_frames()
        with baseline.bare_hop() as ep:
            bare_lat = baseline.bare_latency_us(ep, frames, p["bare_n"])
            bare_rate = baseline.bare_rate(ep, frames, p["bare_n"] * 4, 32)
        rows = []
        with zinfer_server(repository=repo, all_loaded=True) as url:
            for conc in CONCURRENCY:
                for mode in ("ensemble", "chained"):
                    rows.append(asyncio.run(_closed_loops(url, mode, conc, p["seconds"], p["max_requests"])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "params": p,
        "bare": {"round_trip_p50_us": pct(bare_lat, 50), "pipelined_msg_per_s": bare_rate},
        "rows": rows,
    }


def report(r: dict[str, Any]) -> None:
    bare = r["bare"]
    print(f"bare ZeroMQ hop: round trip p50 {bare['round_trip_p50_us']:.1f} us, "
          f"{bare['pipelined_msg_per_s']:.0f} msg/s with 32 in flight")  # fmt: skip
    print(f"{'mode':<9} {'conc':>4} {'req/s':>8} {'p50 us':>9} {'p99 us':>9}  vs bare")
    by = {(row["mode"], row["concurrency"]): row for row in r["rows"]}
    for row in r["rows"]:
        if row["concurrency"] == 1:
            vs = f"p50 / (3 x bare round trip) = {row['p50_us'] / (3 * bare['round_trip_p50_us']):.2f}"
        else:
            vs = f"rate / (bare rate / 3) = {row['req_per_s'] / (bare['pipelined_msg_per_s'] / 3):.2f}"
        print(f"{row['mode']:<9} {row['concurrency']:>4} {row['req_per_s']:>8.0f} {row['p50_us']:>9.0f} "
              f"{row['p99_us']:>9.0f}  {vs}")  # fmt: skip
    for conc in CONCURRENCY:
        e, c = by[("ensemble", conc)], by[("chained", conc)]
        rate, p50, p99 = e["req_per_s"] / c["req_per_s"], e["p50_us"] / c["p50_us"], e["p99_us"] / c["p99_us"]
        print(f"concurrency {conc}: ensemble / chained: throughput {rate:.2f}, p50 {p50:.2f}, p99 {p99:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke test, not a measurement)")
    args = ap.parse_args()
    result = run(QUICK if args.quick else FULL)
    report(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
