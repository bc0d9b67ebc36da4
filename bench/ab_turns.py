"""Two zinfer trees in turns, in one run: CPU per request of each process and the latency or rate.

Each turn runs one load on a fresh server and a fresh client process whose zinfer is the tree given (a
folder that, on ``PYTHONPATH``, imports as ``zinfer``: a symlink tree of a checkout, or a compiled build of
``bench_compiled.build_compiled``), A then B, for ``--rounds`` rounds; the medians per tree and load are
printed, with B's ratio to A. Loads: ``add0:1`` (one sync ``Client``), ``MODEL:N`` (one ``AsyncClient``, N
in flight), ``MODEL:N:threads`` (N threads, a sync ``Client`` each: requests arrive one by one, as from a
front door; ``big:8:threads`` is bench_vs_triton's ``big_c8_threads_shm``), on bench_vs_triton's repository.

Usage: ``.venv/bin/python bench/ab_turns.py A_DIR B_DIR [--loads add0:1,add:32] [--rounds 3] [--seconds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIELDS = ("p50_us", "throughput_s", "broker_us", "workers_us", "client_us", "total_us")


def child(load: str, seconds: float) -> None:
    sys.path.insert(0, str(HERE))
    import vs_triton_repo
    import zinfer_side as z

    model, conc, *how = load.split(":")
    with tempfile.TemporaryDirectory(prefix="zab-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            if how == ["threads"]:
                inputs = z.big_inputs if model == "big" else z.add_inputs  # big: bench_vs_triton's big_c8
                r = z.threads(s, model, int(conc), seconds, 1_000_000, False, inputs)
            elif conc == "1":
                r = z.sync_latency(s, model, seconds, 1_000_000)
            else:
                r = z.async_closed(s, model, int(conc), seconds, 1_000_000)
    print(json.dumps({**{k: r[k] for k in ("p50_us", "throughput_s")}, **r["cpu_per_request"]}))


def turn(tree: Path, load: str, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", load, str(seconds)],
        env=env, cwd="/", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tree} {load} failed:\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--loads", default="add0:1,add:32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for load in args.loads.split(","):
            for name, tree in (("A", args.a), ("B", args.b)):
                res = turn(tree, load, args.seconds)
                runs.setdefault((load, name), []).append(res)
                print(f"round {r} {load} {name}: {json.dumps(res)}", flush=True)
    print(f"medians of {args.rounds} rounds (A {args.a}, B {args.b})")
    print(f"{'load':<10} {'':2} " + " ".join(f"{f:>13}" for f in FIELDS))
    for load in args.loads.split(","):
        med = {n: {f: statistics.median(x[f] for x in runs[(load, n)]) for f in FIELDS} for n in "AB"}
        for n in "AB":
            print(f"{load:<10} {n:2} " + " ".join(f"{med[n][f]:>13.1f}" for f in FIELDS))
        ratios = (med["B"][f] / max(med["A"][f], 1e-9) for f in FIELDS)
        print(f"{load:<10} {'B/A':3}" + " ".join(f"{r:>13.2f}" for r in ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
