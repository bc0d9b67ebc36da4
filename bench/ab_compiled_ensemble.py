"""The three-step ``text_ensemble`` at concurrency 1 (one ``AsyncClient``) on mypyc-compiled builds of two or
more trees, in turns in one run: CPU per request of the broker, of each step's workers and of the client, and
the p50.

CPU is read from the kernel's per-thread nanosecond counters (``/proc/PID/task/TID/schedstat``: every thread
of the process), not psutil's 10 ms ticks, which at 1 s steps are worth ~25 us per request. Each tree (a
checkout, e.g. ``git worktree add /tmp/base COMMIT``) is compiled as a wheel compiles it: its own
``setup.py`` with ``ZINFER_COMPILE=1``, in place, in a copy (as ``bench_compiled.build_compiled``, per tree).
Each round runs a fresh server and client process per tree, one tree after the other, each on its own tree's
model repository (``vs_triton_repo``); the medians over the rounds and each round's ratio to the first tree
are printed.

Usage: ``.venv/bin/python bench/ab_compiled_ensemble.py NAME=TREE NAME=TREE [--rounds 6] [--seconds 3]
[--keep DIR]`` (``--keep``: builds go to DIR/NAME and are reused when there). Writes
``bench/results/ab_compiled_ensemble.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ab_compiled_ensemble.json"
PACKAGES = ("client", "modelconfig", "broker", "workers", "tools", "frontdoor", "configs")
STEPS = ("tokenizer", "lm", "detokenizer")
BUILD_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 300


def build(tree: Path, work: Path) -> Path:
    """``tree`` compiled in a copy under ``work``; the folder that, on PYTHONPATH, imports it as zinfer."""
    path = work / "path"
    if (path / "zinfer").is_dir():
        return path  # kept from an earlier run (--keep)
    src = work / "src"
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    names = subprocess.run(listing, cwd=tree, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        if (tree / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / name, src / name)
    env = {**os.environ, "ZINFER_COMPILE": "1"}
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src, env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"compiling {tree} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (path / "zinfer").mkdir(parents=True)
    for pkg in PACKAGES:
        (path / "zinfer" / pkg).symlink_to(src / pkg, target_is_directory=True)
    for lib in src.glob("zinfer__mypyc*"):
        (path / lib.name).symlink_to(lib)
    return path


def cpu_s(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` so far (0 when it is gone)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def _step_of(cmdline: list[str]) -> str | None:
    try:
        model = cmdline[cmdline.index("--model") + 1]
        return f"{model}#{cmdline[cmdline.index('--instance') + 1]}" if model in STEPS else None
    except (ValueError, IndexError):
        return None


def child(bench_dir: Path, seconds: float, concurrency: int = 1) -> None:
    """One round of one tree (its zinfer on PYTHONPATH, its bench helpers in ``bench_dir``): prints JSON."""
    sys.path.insert(0, str(bench_dir))
    import psutil
    import vs_triton_repo
    import zinfer_side as z

    from zinfer.broker.compiled import compiled_here
    from zinfer.client import AsyncClient

    with tempfile.TemporaryDirectory(prefix="zab-ens-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            kids = psutil.Process(s.pid).children(recursive=True)
            steps = {name: p.pid for p in kids if (name := _step_of(p.cmdline())) is not None}
            others = [p.pid for p in kids if p.pid not in steps.values()]

            async def run() -> dict[str, Any]:
                async with AsyncClient(s.url, timeout=z.TIMEOUT_S) as c:
                    for _ in range(100):
                        if not z._check("text_ensemble", await c.infer("text_ensemble", z.TEXT_INPUTS)):
                            raise RuntimeError("text_ensemble: wrong result")
                    pids = {"broker": s.pid, "client": os.getpid(), **steps}
                    t0 = {k: cpu_s(pid) for k, pid in pids.items()}
                    o0 = sum(cpu_s(pid) for pid in others)
                    lats: list[float] = []
                    end = time.perf_counter() + seconds

                    async def loop() -> None:
                        while time.perf_counter() < end:
                            t = time.perf_counter()
                            await c.infer("text_ensemble", z.TEXT_INPUTS)
                            lats.append(time.perf_counter() - t)

                    await asyncio.gather(*(loop() for _ in range(concurrency)))
                    n = len(lats)
                    per = {k: (cpu_s(pid) - t0[k]) / n * 1e6 for k, pid in pids.items()}
                    other_us = (sum(cpu_s(pid) for pid in others) - o0) / n * 1e6
                    step_us = sum(per[k] for k in steps)
                    return {
                        "requests": n,
                        "concurrency": concurrency,
                        "rate_s": round(n / seconds, 1),
                        "p50_us": round(statistics.median(lats) * 1e6, 1),
                        "broker_us": round(per["broker"], 1),
                        "client_us": round(per["client"], 1),
                        "steps_us": round(step_us, 1),
                        "workers_us": round(step_us + other_us, 1),  # every worker, as bench_vs_triton
                        "per_step_us": {k: round(per[k], 1) for k in sorted(steps)},
                        "compiled_modules": len(compiled_here()),
                    }

            print(json.dumps(asyncio.run(run())), flush=True)


def _commit(tree: Path) -> str:
    """The tree's commit (``+changes`` when its work tree differs), or ``?`` outside git."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return (head or "?") + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("trees", nargs="*", metavar="NAME=TREE")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--keep", type=Path, help="keep the builds in DIR/NAME (and reuse them)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight on the one AsyncClient")
    ap.add_argument("--results", type=Path, help="write here instead of the tracked results file")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.seconds, args.concurrency)
        return 0
    if len(args.trees) < 2:
        ap.error("give two trees or more, NAME=TREE each")
    trees = {n: Path(t).resolve() for n, t in (x.split("=", 1) for x in args.trees)}
    work = args.keep or Path(tempfile.mkdtemp(prefix="zab-build-"))
    try:
        built = {}
        for name, tree in trees.items():
            t0 = time.perf_counter()
            built[name] = build(tree, work / name)
            print(f"{name}: {tree} built in {time.perf_counter() - t0:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in trees}
        for i in range(args.rounds):
            for name, path in built.items():
                env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(path)}
                bench = work / name / "src" / "bench"  # the tree's own helpers and model repository
                cmd = [sys.executable, __file__, "--child", str(bench), "--seconds", str(args.seconds),
                       "--concurrency", str(args.concurrency)]  # fmt: skip
                done = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd="/"
                )
                if done.returncode != 0:
                    raise SystemExit(f"{name} round {i + 1} failed:\n{done.stderr[-3000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                runs[name].append(r)
                print(
                    f"round {i + 1} {name:>8}: workers {r['workers_us']:7.1f} (steps {r['steps_us']:7.1f}) "
                    f"broker {r['broker_us']:7.1f} client {r['client_us']:6.1f} p50 {r['p50_us']:7.1f} us "
                    f"{r['rate_s']:7.1f}/s "
                    f"({r['requests']} requests, {r['compiled_modules']} modules compiled)",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    keys = ("workers_us", "steps_us", "broker_us", "client_us", "p50_us", "rate_s")
    summary = {n: {k: round(statistics.median(r[k] for r in rs), 1) for k in keys} for n, rs in runs.items()}
    first = next(iter(trees))
    ratios = {
        n: round(
            statistics.median(
                b["workers_us"] / a["workers_us"] for a, b in zip(runs[first], rs, strict=True)
            ),
            3,
        )
        for n, rs in runs.items()
        if n != first
    }
    print("medians (us per request):")
    for n, m in summary.items():
        print(f"  {n:>8}: " + "  ".join(f"{k} {v}" for k, v in m.items()))
    for n, q in ratios.items():
        print(f"  workers {n}/{first}, median of the rounds' ratios: {q}")
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trees": {n: _commit(t) for n, t in trees.items()},  # the commits, not this machine's paths
        "rounds": args.rounds,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "medians": summary,
        "workers_ratio_to_first": ratios,
        "runs": runs,
    }
    out = RESULTS if args.concurrency == 1 else RESULTS.with_name(f"{RESULTS.stem}_c{args.concurrency}.json")
    out = args.results or out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
