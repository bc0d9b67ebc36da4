"""The c32 floor: what the design itself allows for issue 31's concurrency-32 goals, beside zinfer and Triton
in turns in one run, with rate, p50 and CPU per request per process.

Levels (each turn a fresh child process and fresh servers):

* ``bare``: ``floor_relay``'s bare relay pipelined (32 out, each request a message; the frames of a real
  ``add`` request): the relay the issue's c32 CPU goal is a ratio to;
* ``floor-add0``: ``floor_relay``'s ``numpy`` floor at c32 (the built-in add, no python-backend contract);
* ``floor-add``: ``floor_ens_procs`` + ``floor_pb``: the Triton-style ``add`` through the python-backend
  contract (its own ``model.py`` run on the cheapest ``pb_utils`` objects), one instance, batched as the
  broker does while the instance is busy; the client keeps 32 out, what it has sent as one BUNDLE;
* ``floor-ens``: the same for ``text_ensemble``: client -> broker -> tokenizer (2 processes, serial runs) ->
  broker -> lm (2, batched) -> broker -> detokenizer (2) -> broker -> client, real records, real model code;
* ``floor-ens1``: ``floor-ens`` with one request per EXECUTE to the steps without dynamic batching (no
  serial runs: each request a message to and from the worker, as Triton's default scheduler gives an
  instance one request at a time);
* ``zinfer``: ``zinfer serve`` on ``vs_triton_repo`` (compiled with ``--compiled``, as bench_vs_triton's
  ``--compiled``), one ``AsyncClient`` with 32 tasks on ``add``, then on ``text_ensemble``;
* ``triton``: Triton 2.51 on the same repository, perf_analyzer at concurrency 32 on ``add``, then on
  ``text_ensemble``; CPU per request from the server's processes (tritonserver, each model's stubs) and
  perf_analyzer's, over the requests Triton's statistics counted in that time.

CPU is read from the kernel's per-thread counters (``/proc/PID/task/TID/schedstat``, as
``ab_compiled_ensemble.cpu_s``), with the times each thread was scheduled in (wakes per request; Triton's:
the server's, not perf_analyzer's), and each model's requests per execution from the statistics counts
(the floor's broker writes its own on SIGUSR1, with its EXECUTE messages). The order of the levels is
reversed every other round.

Usage: ``.venv/bin/python bench/floor_ensemble.py [--triton-venv DIR] [--rounds 2] [--seconds 2]
[--levels L,L] [--compiled [--build DIR]] [--label L]`` (``--build DIR`` keeps zinfer's and the floor's
mypyc builds there; remove ``DIR/floor`` after changing the floor). Results:
bench/results/floor_ensemble.json (an entry per label) and floor_ensemble.txt (their tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "floor_ensemble.json"
TABLE = HERE / "results" / "floor_ensemble.txt"
LEVELS = ("bare", "floor-add0", "floor-add", "floor-ens", "floor-ens1", "zinfer", "triton")
FLOOR_MODULES = ("floor_procs", "floor_pb", "floor_ens_procs")
STEPS = ("tokenizer", "lm", "detokenizer")
WINDOW = 32
TURN_TIMEOUT_S = 240


# -------------------------------------------------------------------------------------------- the run


def turn(tree: str, level: str, seconds: float, venv: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--child", level, str(seconds), venv],
        env=env, cwd="/", capture_output=True, text=True, timeout=TURN_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:  # said, and the run goes on without it
        print(f"{level} failed:\n{done.stderr[-1500:]}", flush=True)
        return {"failed": done.stderr[-300:]}
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


COLUMNS = ("rate_s", "p50_us", "broker_us", "add_us", "worker_us", *(f"{s}_us" for s in STEPS), "other_us",
           "client_us", "total_us", "wakes_per_request")  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per load and level; the ratios the issue's goals are about."""
    med: dict[str, dict[str, Any]] = {}
    for key, xs in runs.items():
        med[key] = {c: statistics.median(x[c] for x in xs) for c in COLUMNS if all(x.get(c) is not None
                                                                                    for x in xs)}  # fmt: skip
        if all("batches" in x for x in xs):  # per model: the medians of each count's ratio
            first = xs[0]["batches"]
            med[key]["batches"] = {
                m: {k: statistics.median(x["batches"][m][k] for x in xs) for k in first[m]} for m in first
            }

    def q(a: str, b: str, col: str = "rate_s") -> float | None:
        x, y = med.get(a, {}).get(col), med.get(b, {}).get(col)
        return round(x / y, 3) if x and y else None

    ratios = {}
    for load in ("add", "ens"):
        fl = f"{load}/floor-{load}"
        ratios[f"{load}_c32_rate_floor_over_triton"] = q(fl, f"{load}/triton")
        ratios[f"{load}_c32_rate_zinfer_over_triton"] = q(f"{load}/zinfer", f"{load}/triton")
        ratios[f"{load}_c32_rate_zinfer_over_floor"] = q(f"{load}/zinfer", fl)
        ratios[f"{load}_c32_cpu_zinfer_over_floor"] = q(f"{load}/zinfer", fl, "total_us")
        ratios[f"{load}_c32_cpu_floor_over_triton"] = q(fl, f"{load}/triton", "total_us")
    ratios["add_c32_cpu_floor_over_bare"] = q("add/floor-add", "add/bare", "total_us")
    ratios["add_c32_cpu_floor_add0_over_bare"] = q("add/floor-add0", "add/bare", "total_us")
    ratios["add_c32_cpu_zinfer_over_bare"] = q("add/zinfer", "add/bare", "total_us")
    return {"medians": med, "ratios": ratios}


def table(s: dict[str, Any]) -> str:
    heads = (
        "rate/s",
        "p50",
        "broker",
        "add",
        "worker",
        "tok",
        "lm",
        "detok",
        "other",
        "client",
        "total",
        "wakes",
    )
    lines = [f"{'load/level':<18}" + "".join(f"{h:>8}" for h in heads) + "   (CPU us per request)"]
    for key, m in s["medians"].items():
        cells = (
            f"{m[c]:>8.{1 if c == 'wakes_per_request' else 0}f}" if c in m else f"{'-':>8}" for c in COLUMNS
        )
        lines.append(f"{key:<18}" + "".join(cells))
    for key, m in s["medians"].items():  # inferences per execution (per EXECUTE message: the floor's)
        if "batches" in m:
            cells = []
            for n, b in m["batches"].items():
                per_msg = f" ({b['per_message']:.1f} a message)" if "per_message" in b else ""
                cells.append(f"{n} {b['per_execution']:.1f}{per_msg}")
            lines.append(f"  batch {key:<16} " + ", ".join(cells))
    lines += [f"  {k:<40} {v}" for k, v in s["ratios"].items()]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        from floor_ens_turns import child

        child(sys.argv[2], float(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", help="a venv with Triton; without it no triton level")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--label", default="latest", help="the results entry this run writes (replaces)")
    ap.add_argument("--compiled", action="store_true", help="zinfer and the floor compiled by mypyc")
    ap.add_argument("--build", type=Path, help="with --compiled: reuse (or make) the builds in this folder")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_serving import machine
    from floor_relay import build_floor, pure_tree, write_results

    t_start = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="zfe-tree-") as tmp:
        pure = pure_tree(Path(tmp) / "pure")
        tree = str(pure)
        if args.compiled:
            from bench_compiled import build_compiled

            work = args.build or Path(tmp) / "build"
            zinfer = work / "path" if (work / "path").exists() else build_compiled(work)
            floor = work / "floor"  # with --build, kept and reused: remove it after changing the floor
            if not all(list(floor.glob(f"{m}.*.so")) for m in FLOOR_MODULES):
                build_floor(floor, pure, FLOOR_MODULES)
            tree = f"{floor}:{zinfer}"
        runs: dict[str, list[dict[str, Any]]] = {}
        failures: list[str] = []
        levels = args.levels.split(",")
        if args.triton_venv is None and "triton" in levels:
            print("no --triton-venv: the triton level is left out", flush=True)
            levels.remove("triton")
        for r in range(args.rounds):
            for level in levels if r % 2 == 0 else levels[::-1]:
                res = turn(tree, level, args.seconds, args.triton_venv)
                for load in ("add", "ens"):
                    if load in res:
                        runs.setdefault(f"{load}/{level}", []).append(res[load])
                if "failed" in res:
                    failures.append(f"round {r} {level}")
                print(f"round {r} {level}: {json.dumps(res)}", flush=True)
    s = summarize(runs)
    text = table(s)
    print(text)
    run = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(
            ["bench/floor_ensemble.py", *(("DIR" if a.startswith("/") else a) for a in sys.argv[1:])]
        ),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": machine(),
        "params": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "window": WINDOW,
            "compiled": args.compiled,
        },
        **s,
        "table": text.splitlines(),
        "runs": runs,
        "failed_turns": failures,
        "wall_s": round(time.monotonic() - t_start, 1),
        "load_average_1m_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    write_results(RESULTS, TABLE, args.label, run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
