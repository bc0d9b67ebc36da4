"""How fast a front door written on each Python server stack could be: the stack doing nothing, beside
Triton 2.51 and zinfer's door, all measured by perf_analyzer in one run.

``frontdoor_replay.py`` answers perf_analyzer's ``add`` infers with bytes recorded from zinfer's door (no
decoding, no broker, no model) on grpcio's asyncio server (zinfer's door), the same on uvloop, pygrpc-native's
grpc.aio-compatible server (HTTP/2 and gRPC in Rust, ``pip install pygrpc-native``), grpcio's
thread-pool server, aiohttp's low-level server (zinfer's door) and a bare asyncio protocol around httptools.
Each is measured at concurrency 32 (throughput) and 1 (p50), as ``bench_frontdoor.py`` measures the door.
The ratio of each to Triton says how far the issue's goals (gRPC and HTTP at c32 >= 1.0x Triton, c1 p50 <=
1.2x) can be reached by a door on that stack at all, on this machine: a replay is an upper bound, the door
does strictly more (decode, the broker's hop, the model, encode) on the same cores.

Usage: ``.venv/bin/python bench/bench_frontdoor_ceiling.py --triton-venv DIR [--quick] [--kinds K,...]``.
Stacks whose library is not installed (uvloop, httptools: ``pip install uvloop httptools``) are
skipped and said so.
Results: bench/results/bench_frontdoor_ceiling.json (replaced by each run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, Target, _free_port, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bench_frontdoor_ceiling.json"
REPLAY = Path(__file__).resolve().parent / "frontdoor_replay.py"
STACKS = {  # kind -> (protocol, library it needs beyond the front door's)
    "grpc-aio": ("grpc", None),
    "grpc-aio-uvloop": ("grpc", "uvloop"),
    "grpc-native-aio": ("grpc", "pygrpc_native"),
    "grpc-h2corn": ("grpc", "h2corn"),
    "h2corn": ("http", "h2corn"),
    "grpc-sync-2": ("grpc", None),
    "grpc-sync-16": ("grpc", None),
    "aiohttp": ("http", None),
    "httptools": ("http", "httptools"),
    "httptools-uvloop": ("http", "httptools"),
}
READY_S = 30.0


def steps(
    pa: Path, env: dict[str, str], target: Target, protocols: tuple[str, ...], ms: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for protocol in protocols:
        for concurrency in (32, 1):
            name = f"{protocol}_c{concurrency}"
            try:
                out[name] = perf_analyzer(pa, env, target, protocol, "add", concurrency, ADD_SHAPES, ms)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                out[name] = {"error": str(exc)[-600:]}
            fig = out[name]
            shown = (
                f"{fig['throughput_s']:8.0f}/s p50 {fig['p50_us']:7.0f} us"
                if "error" not in fig
                else "failed"
            )
            print(f"{target.name:18s} {name:9s} {shown}", flush=True)
    return out


def replay(pa: Path, env: dict[str, str], kind: str, door: Target, ms: int) -> dict[str, Any]:
    protocol, _ = STACKS[kind]
    port = _free_port()
    upstream = door.grpc if protocol == "grpc" else door.http
    proc = subprocess.Popen(
        [sys.executable, str(REPLAY), kind, upstream, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], READY_S)  # never wait on it unbounded
        line = proc.stdout.readline() if readable else ""  # "ready", or "" when it exited
        if line.strip() != "ready":
            raise RuntimeError(f"replay {kind} did not start (exit {proc.poll()})")
        address = f"127.0.0.1:{port}"
        return steps(pa, env, Target(kind, address, address), (protocol,), ms)
    finally:
        proc.kill()
        proc.wait(10)


def ratios(triton: dict[str, Any] | None, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if triton is None:
        return out
    for name, row in rows.items():
        for step, fig in row.items():
            base = triton.get(step, {})
            if "error" in fig or "error" in base:
                continue
            out[f"{name} {step}"] = {
                "throughput_x": round(fig["throughput_s"] / base["throughput_s"], 3),
                "p50_x": round(fig["p50_us"] / base["p50_us"], 3),
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--triton-venv",
        type=Path,
        required=True,
        help="venv with nvidia-pytriton 0.7.0 and tritonclient[all] 2.51",
    )
    ap.add_argument("--quick", action="store_true", help="1 s measurement windows instead of 2 s")
    ap.add_argument("--kinds", help=f"only these stacks, comma-separated (of {', '.join(STACKS)})")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else list(STACKS)
    if unknown := [k for k in kinds if k not in STACKS]:
        print(f"unknown stacks: {', '.join(unknown)}")
        return 2
    pa = args.triton_venv / "bin" / "perf_analyzer"
    if not pa.exists():
        print("no perf_analyzer in --triton-venv (tritonclient 2.51's wheel): nothing to measure with")
        return 1
    ms = 1000 if args.quick else 2000
    install = triton_side.find(args.triton_venv)
    env_dir = Path(tempfile.mkdtemp(prefix="zfc-env-"))
    rows: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    try:
        found = install or triton_side.TritonInstall(
            args.triton_venv, args.triton_venv / "bin" / "python", Path()
        )
        env = triton_side._environment(found, env_dir)
        with tempfile.TemporaryDirectory(prefix="zfc-repo-") as tmp:
            repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
            triton = None
            if install is not None:
                with triton_side.serve(install, repo, ("add",)) as s:
                    triton = steps(pa, env, Target("triton", s.grpc, s.http), ("grpc", "http"), ms)
            else:
                print("no tritonserver in --triton-venv: no ratios")
            with zinfer_front_door(repo, 1) as door:
                rows["zinfer door"] = steps(pa, env, door, ("grpc", "http"), ms)
                for kind in kinds:
                    library = STACKS[kind][1]
                    missing = [m for m in ("uvloop",) * kind.endswith("-uvloop") + (library or "",) if m]
                    missing = [m for m in missing if importlib.util.find_spec(m) is None]
                    if missing:
                        skipped[kind] = f"not installed: {', '.join(missing)}"
                        print(f"{kind:18s} skipped: {skipped[kind]}")
                        continue
                    rows[f"replay {kind}"] = replay(pa, env, kind, door, ms)
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    r = ratios(triton, rows)
    for name, fig in r.items():
        print(f"{name:36s} throughput {fig['throughput_x']:5.2f}x Triton   p50 {fig['p50_x']:5.2f}x Triton")
    result = {"machine": machine(), "params": {"interval_ms": ms}, "triton": triton, "rows": rows,
              "ratios": r, "skipped": skipped}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
