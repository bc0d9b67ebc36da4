"""The dynamic batcher alone: CPU per request of what the broker calls for each request, in one process.

Per request: a ``QueuedRequest`` built, ``DynamicBatcher.add``, ``reached_preferred``, ``next_deadline`` and
``pop_ready`` as the broker asks them, on the policies of bench_vs_triton's ``add0`` (max_batch_size 64, delay
0: one request per batch, as at c1) and ``add`` (preferred 16/32/64, delay 500 us with early dispatch; batches
of 16 formed from a full queue, as at c32). Runs whatever ``zinfer`` is on ``PYTHONPATH`` (a checkout, or a
compiled build of ``bench_compiled.build_compiled``) and says whether its batcher is compiled. Give two trees
to run them in turns (``--rounds``) and print B's ratio to A.

Usage: ``.venv/bin/python bench/micro_batcher.py A_TREE [B_TREE] [--rounds 5] [--requests 200000]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(requests: int) -> None:
    from zinfer.broker.batching import batcher as mod
    from zinfer.broker.batching.batcher import BatchPolicy, DynamicBatcher, QueuedRequest

    out: dict[str, object] = {"compiled": mod.__file__.endswith(".so")}
    add0 = BatchPolicy(64, max_queue_delay_us=0)
    add = BatchPolicy(64, (16, 32, 64), max_queue_delay_us=500, early_dispatch=True)
    for name, policy, group in (("add0_c1", add0, 1), ("add_c32", add, 16)):
        batcher: DynamicBatcher[int] = DynamicBatcher(policy)
        now = 0.0
        t0 = time.process_time()
        for i in range(requests // group):
            for j in range(group):
                now += 1e-6
                batcher.add(QueuedRequest(i * group + j, 1, "k", now, 0, 0, 8), now, True)
                batcher.reached_preferred(1)
            batcher.next_deadline()
            batches = batcher.pop_ready(now, 1)
            assert len(batches) == 1 and len(batches[0].items) == group, (name, batches)
        out[name] = (time.process_time() - t0) / requests * 1e6
    print(json.dumps(out))


def turn(tree: str, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(requests)],
        env=env, cwd="/", capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200_000)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            runs[tree].append(turn(tree, args.requests))
    first: dict[str, float] = {}
    for tree in args.trees:
        loads = [k for k in runs[tree][0] if k != "compiled"]
        medians = {k: statistics.median(r[k] for r in runs[tree]) for k in loads}
        ratio = "  ".join(f"{k} {medians[k] / first[k]:.2f}x" for k in loads) if first else ""
        first = first or medians
        shown = "  ".join(f"{k} {v:.2f} us/req" for k, v in medians.items())
        print(f"{tree} (batcher compiled: {runs[tree][0]['compiled']}): {shown}  {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
