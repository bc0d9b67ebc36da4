"""The mypyc-compiled build against pure Python, in turns in one run, beside the bare ZeroMQ limits.

The compiled modules are built the way a wheel builds them (``setup.py`` with ``ZINFER_COMPILE=1``, in place,
in a copy of the checkout, with the venv's mypy). Each load then runs in a fresh server and a fresh client
process, pure Python and compiled in turn, for ``--rounds`` rounds, on bench_vs_triton's repository:

* ``add0`` (built-in add, delay 0), one sync ``Client``, one request in flight: p50 against the bare
  DEALER -> ROUTER -> DEALER round trip of ``baseline.py``;
* ``add0`` with 128 in flight (one ``AsyncClient``): the rate against the bare pipelined rate;
* ``add`` (the Triton-style model, preferred 16/32/64, delay 500 us), 32 in flight (one ``AsyncClient``);
* the three-step ``text_ensemble``, 32 in flight (one ``AsyncClient``);
* CPU per request of the broker, the workers and the client (their user + system time).

The figures printed are the medians over the rounds. Writes ``bench/results/bench_compiled.json``.

Usage: ``.venv/bin/python bench/bench_compiled.py [--rounds 3] [--seconds 3]``
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from bench_serving import ROOT, bare_frames, machine, pct  # noqa: E402

LOADS = (("add0", 1), ("add0", 128), ("add", 32), ("text_ensemble", 32))
PACKAGES = ("client", "modelconfig", "broker", "workers", "tools", "frontdoor", "configs")
BUILD_TIMEOUT_S = 900
STEP_TIMEOUT_S = 300


def build_compiled(work: Path) -> Path:
    """Compile a copy of the checkout in place; returns a folder that, on PYTHONPATH, imports it as zinfer."""
    src = work / "src"
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listing, cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {**os.environ, "ZINFER_COMPILE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=src, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"compiling failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    path = work / "path"
    (path / "zinfer").mkdir(parents=True)
    for pkg in PACKAGES:
        (path / "zinfer" / pkg).symlink_to(src / pkg, target_is_directory=True)
    libs = list(src.glob("zinfer__mypyc*"))
    if not libs:  # setup.py builds pure Python when mypyc refuses the code: no build to measure
        raise SystemExit(f"compiling failed: mypyc built nothing\n{done.stdout[-3000:]}")
    for lib in libs:
        (path / lib.name).symlink_to(lib)
    return path


def child(model: str, in_flight: int, seconds: float) -> None:
    """One load on a fresh server; prints its result as one JSON line."""
    import vs_triton_repo
    import zinfer_side as z

    from zinfer.broker.compiled import compiled_here

    with tempfile.TemporaryDirectory(prefix="zbc-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            if in_flight == 1:
                r = z.sync_latency(s, model, seconds, 100_000)
            else:
                r = z.async_closed(s, model, in_flight, seconds, 100_000)
    r["compiled_modules"] = len(compiled_here())
    print(json.dumps(r), flush=True)


def step(model: str, in_flight: int, seconds: float, path: Path | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    cmd = [sys.executable, __file__, "--child", model, str(in_flight), str(seconds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, cwd="/")
    if done.returncode != 0:
        raise SystemExit(f"{model} c{in_flight} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in runs), 1)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = {
        k: round(statistics.median(r["cpu_per_request"][k] for r in runs), 1)
        for k in runs[0]["cpu_per_request"]
    }
    return {
        "throughput_s": _median(runs, "throughput_s"),
        "p50_us": _median(runs, "p50_us"),
        "cpu_per_request": cpu,
        "errors": sum(int(r["errors"]) for r in runs),
        "compiled_modules": sorted({int(r["compiled_modules"]) for r in runs}),
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "IN_FLIGHT", "SECONDS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), float(a.child[2]))
        return 0
    from zinfer.broker.compiled import COMPILED

    work = Path(tempfile.mkdtemp(prefix="zbc-build-"))
    try:
        path = build_compiled(work)
        with baseline.bare_hop() as ep:
            frames = bare_frames()
            lats = baseline.bare_latency_us(ep, frames, 3000)
            bare = {
                "p50_us": round(pct(lats, 50), 1),
                "rate_64_in_flight_s": baseline.bare_rate(ep, frames, 30_000, 64),
            }
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for r in range(a.rounds):
            for model, n in LOADS:
                for build, p in (("pure", None), ("compiled", path)):
                    res = step(model, n, a.seconds, p)
                    runs.setdefault(f"{model}_c{n}", {}).setdefault(build, []).append(res)
                    cpu = res["cpu_per_request"]["total_us"]
                    print(f"round {r + 1} {model} c{n} {build:8s} {res['throughput_s']:8.0f}/s  p50 "
                          f"{res['p50_us']:7.0f} us  CPU {cpu:6.0f} us/request", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"machine": machine(), "rounds": a.rounds, "seconds": a.seconds, "bare": bare}
    out["modules"] = list(COMPILED)
    print(
        f"\nbare DEALER->ROUTER->DEALER: p50 {bare['p50_us']:.0f} us, {bare['rate_64_in_flight_s']:.0f} msg/s"
    )
    print(
        f"{'load':18s} {'build':9s} {'req/s':>8s} {'p50 us':>8s}  CPU us/request: broker workers client total"
    )
    for load, by in runs.items():
        out[load] = {b: _summary(v) for b, v in by.items()}
        for b, s in out[load].items():
            c = s["cpu_per_request"]
            print(f"{load:18s} {b:9s} {s['throughput_s']:8.0f} {s['p50_us']:8.0f}  {c['broker_us']:14.0f} "
                  f"{c['workers_us']:7.0f} {c['client_us']:6.0f} {c['total_us']:5.0f}")  # fmt: skip
    ratios: dict[str, float] = {}
    for load in runs:
        pure, comp = out[load]["pure"], out[load]["compiled"]
        ratios[f"{load}_rate_compiled_over_pure"] = round(comp["throughput_s"] / pure["throughput_s"], 3)
        for who in ("broker_us", "client_us", "total_us"):
            key = f"{load}_cpu_{who[:-3]}_compiled_over_pure"
            ratios[key] = round(comp["cpu_per_request"][who] / pure["cpu_per_request"][who], 3)
    for b in ("pure", "compiled"):
        ratios[f"add0_c1_p50_over_bare_{b}"] = round(out["add0_c1"][b]["p50_us"] / bare["p50_us"], 3)
        ratios[f"add0_c128_rate_over_bare_{b}"] = round(
            out["add0_c128"][b]["throughput_s"] / bare["rate_64_in_flight_s"], 3
        )
    out["ratios"] = ratios
    print("ratios")
    for k, v in ratios.items():
        print(f"  {k:48s} {v:6.3f}")
    dest = ROOT / "bench" / "results" / "bench_compiled.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
