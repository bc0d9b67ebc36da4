"""How closely ``max_queue_delay_microseconds`` is kept: the queue time a lone request spends waiting for
its batch, against the delay it asked for.

One server, the built-in add kernel under four configs that differ only in the delay (0, 100, 500 and
2000 µs; max_batch_size 64, so a lone request always waits the whole delay). One sync ``Client`` sends one
request at a time; the figure is the server's own mean queue time per request (``statistics``:
Triton's ``queue`` duration, from the request's arrival to its dispatch), over ``--requests`` requests.

Limits, measured in the same run: the delay itself; the queue time at delay 0 (what the broker spends
on a request between its arrival and its dispatch, with no wait at all); and how late this machine's
kernel wakes a thread from ``select`` for the same delay, with the timer slack the broker sets (1 µs) and
with the default (50 µs). The overshoot (queue time - delay) is printed beside the delay-0 queue time plus
the kernel's own lateness, as a ratio. The issue's goal: an overshoot within 50 µs.

Usage: ``.venv/bin/python bench/bench_queue_delay.py [--requests N]`` (default 1500; under a minute).
Results go to bench/results/bench_queue_delay.json, under ``--label`` (other labels' runs are kept).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROOT, machine  # noqa: E402
from zinfer_side import serve  # noqa: E402

from zinfer.client import Client  # noqa: E402

OUT = ROOT / "bench" / "results" / "bench_queue_delay.json"
DELAYS_US = (0, 100, 500, 2000)
ONE = np.ones((1, 1), np.float32)
GOAL_US = 50.0

CONFIG = """name: "{name}"
backend: "zinfer"
max_batch_size: 64
input [
  {{ name: "INPUT_A" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "INPUT_B" data_type: TYPE_FP32 dims: [ 1 ] }}
]
output [ {{ name: "OUTPUT_SUM" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "kernel" value: {{ string_value: "add" }} }}
"""

# the kernel's lateness waking from select, in a child so the slack set there is its own
SELECT_PROBE = """
import select, statistics, sys, time
from zinfer.broker.precise_wait import tighten_timer_slack
if sys.argv[2] == "tight":
    assert tighten_timer_slack()
delay = float(sys.argv[1]) / 1e6
late = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    select.select([], [], [], delay)
    late.append((time.perf_counter() - t - delay) * 1e6)
print(statistics.median(late))
"""


def kernel_lateness_us(delay_us: int, slack: str, n: int) -> float:
    if delay_us == 0:
        return 0.0
    out = subprocess.run(
        [sys.executable, "-c", SELECT_PROBE, str(delay_us), slack, str(n)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return round(float(out.stdout.strip()), 1)


def queue_us(client: Client, model: str, requests: int) -> float:
    def stats() -> tuple[int, int]:
        queue = client.statistics(model)["model_stats"][0]["inference_stats"]["queue"]
        return int(queue["count"]), int(queue["ns"])

    for _ in range(100):
        client.infer(model, {"INPUT_A": ONE, "INPUT_B": ONE})
    c0, ns0 = stats()
    deadline = time.monotonic() + 120
    for _ in range(requests):
        if time.monotonic() > deadline:
            break
        client.infer(model, {"INPUT_A": ONE, "INPUT_B": ONE})
    c1, ns1 = stats()
    return round((ns1 - ns0) / max(1, c1 - c0) / 1000, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--label", default="main", help="the run's name in the results file (others are kept)")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zqd-"))
    repo = root / "models"
    for delay in DELAYS_US:
        name = f"add_delay{delay}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, delay=delay))
    rows: list[dict[str, Any]] = []
    with serve(repo) as server, Client(server.url, timeout=30) as client:
        base = queue_us(client, "add_delay0", args.requests)
        for delay in DELAYS_US:
            got = base if delay == 0 else queue_us(client, f"add_delay{delay}", args.requests)
            tight = kernel_lateness_us(delay, "tight", 2000)
            default = kernel_lateness_us(delay, "default", 2000)
            over = round(got - delay, 1)
            limit = round(base + tight, 1)
            rows.append({
                "delay_us": delay, "queue_us": got, "overshoot_us": over,
                "limit_overshoot_us": limit, "kernel_late_tight_slack_us": tight,
                "kernel_late_default_slack_us": default,
                "overshoot_over_limit": round(over / limit, 2) if limit else None,
                "goal_met": over <= GOAL_US,
            })  # fmt: skip
    print(f"{'delay us':>9} {'queue us':>9} {'over us':>8} {'limit us':>9} {'ratio':>6}"
          f" {'select late (1us slack)':>24} {'(50us slack)':>13}")  # fmt: skip
    for r in rows:
        ratio = "-" if r["overshoot_over_limit"] is None else f"{r['overshoot_over_limit']:.2f}"
        print(f"{r['delay_us']:>9} {r['queue_us']:>9} {r['overshoot_us']:>8} {r['limit_overshoot_us']:>9}"
              f" {ratio:>6} {r['kernel_late_tight_slack_us']:>24}"
              f" {r['kernel_late_default_slack_us']:>13}")  # fmt: skip
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
              "requests": args.requests, "goal_overshoot_us": GOAL_US, "rows": rows}  # fmt: skip
    runs = json.loads(OUT.read_text()).get("runs", {}) if OUT.exists() else {}
    runs[args.label] = result
    OUT.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    print(f"results: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
