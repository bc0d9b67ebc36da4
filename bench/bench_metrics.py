"""What metrics cost: ``add`` throughput at concurrency 32 with metrics on (and scraped every second, as
Prometheus would) against metrics off, in one run, alternating rounds so drift hits both alike.

Usage: ``.venv/bin/python bench/bench_metrics.py [--quick]``; results in bench/results/bench_metrics.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import RESULTS, machine, throughput_step, zinfer_server  # noqa: E402

OUT = RESULTS.parent / "bench_metrics.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scraper(url: str, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        count[0] += 1


def measure(metrics_on: bool, seconds: float) -> dict[str, Any]:
    port = _free_port()
    extra = ("--metrics", f"127.0.0.1:{port}") if metrics_on else ("--no-metrics",)
    with zinfer_server(extra=extra) as url:
        throughput_step(url, 32, min(2.0, seconds), 10**9)  # warm up
        stop, scrapes = threading.Event(), [0]
        scraper = None
        if metrics_on:
            target = f"http://127.0.0.1:{port}/metrics"
            scraper = threading.Thread(target=_scraper, args=(target, stop, scrapes))
            scraper.start()
        try:
            step = throughput_step(url, 32, seconds, 10**9)
        finally:
            stop.set()
            if scraper is not None:
                scraper.join(15)
    return {"metrics": metrics_on, "req_per_s": step["req_per_s"], "scrapes": scrapes[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds, seconds = (1, 2.0) if args.quick else (6, 4.0)
    runs = []
    for _ in range(rounds):
        for on in (True, False):
            runs.append(measure(on, seconds))
            print(f"  metrics={'on ' if on else 'off'}  {runs[-1]['req_per_s']:8.0f} req/s", flush=True)
    on = statistics.median(r["req_per_s"] for r in runs if r["metrics"])
    off = statistics.median(r["req_per_s"] for r in runs if not r["metrics"])
    cost = (off - on) / off
    print(f"add @ concurrency 32: metrics on {on:.0f} req/s, off {off:.0f} req/s, "
          f"cost {cost * 100:.1f}% (target < 5%)")  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"machine": machine(), "rounds": rounds, "seconds": seconds, "runs": runs,
                               "median_on": on, "median_off": off, "cost": cost, "target": "< 0.05",
                               "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
