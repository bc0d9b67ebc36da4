"""The three-step ensemble at 32 in flight through the gRPC door and with the native ``AsyncClient``, on the
same zinfer servers, in turns: what the door costs the broker (and the door itself) per request.

Each variant (``NAME`` or ``NAME:KEY=VALUE,...``, the environment its ``zinfer serve`` starts with, e.g.
``PYTHONPATH=DIR`` for another tree's code) is one server, up for the whole run. Per round and variant, two
turns: ``door`` (``bench_frontdoor_ensemble``'s tritonclient.grpc.aio client, 32 coroutines, on the door's
gRPC address) and ``native`` (zinfer's ``AsyncClient``, 32 coroutines, on the broker's socket). Printed per
turn: throughput, p50 and the server's CPU per request by process (broker, door, workers). Variants and
sides alternate order by round. ``--spy DIR`` also records py-spy (``--gil``) of the broker in each turn
(``--spy-process door``: of the door).

Usage: ``.venv/bin/python bench/ab_door_ensemble.py --triton-venv DIR --variant new
[--variant base:PYTHONPATH=TREE] [--rounds 3] [--seconds 5]``. Results: bench/results/ab_door_ensemble.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from ab_frontdoor_http import _environment, _variant  # noqa: E402
from bench_frontdoor import zinfer_front_door  # noqa: E402
from bench_frontdoor_ensemble import IN_FLIGHT, LOOP, _cpu_by_role, _tree, turn  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ab_door_ensemble.json"
PYSPY = Path(sys.executable).parent / "py-spy"

NATIVE = r"""
import asyncio, json, sys, time
import numpy as np
from zinfer.client import AsyncClient

url, text, expected = sys.argv[1], sys.argv[4], sys.argv[5]
seconds, in_flight = float(sys.argv[2]), int(sys.argv[3])

async def main():
    client = AsyncClient(url)
    errors = 0
    async def one_call():
        nonlocal errors
        r = await client.infer("text_ensemble", {"TEXT": np.array([[text.encode()]], dtype=object)})
        if r.as_numpy("RESULT").reshape(-1)[0] != expected.encode():
            errors += 1
""" + LOOP


def native_turn(url: str, seconds: float, root_pid: int, env: dict[str, str]) -> dict[str, Any]:
    procs = _tree(root_pid)
    cpu0 = _cpu_by_role(procs, root_pid, "zinfer")
    args = [sys.executable, "-c", NATIVE, url, str(seconds), str(IN_FLIGHT),
            vs_triton_repo.TEXT.decode(), vs_triton_repo.EXPECTED.decode()]  # fmt: skip
    with _environment(env):
        run = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120, check=False)
    cpu1 = _cpu_by_role(procs, root_pid, "zinfer")
    if run.returncode != 0:
        return {"error": run.stderr[-1500:]}
    fig: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    n = max(1, int(fig["requests"]))
    fig["server_cpu_us_per_request"] = {
        role: round(1e6 * (cpu1[role] - cpu0.get(role, 0.0)) / n, 1) for role in sorted(cpu1)
    }
    return fig


def _spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    cmd = [str(PYSPY), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200", "--gil",
           "--nonblocking", "--nolineno", "--format", "raw", "--output", str(out)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _median(figs: list[dict[str, Any]], role: str) -> float:
    return round(statistics.median(f["server_cpu_us_per_request"].get(role, 0.0) for f in figs), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="venv with tritonclient 2.51")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sides", default="door,native")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where to write (default: tracked file)")
    ap.add_argument("--spy", type=Path, help="a folder for py-spy's raw stacks per turn")
    ap.add_argument(
        "--spy-process", default="broker", choices=("broker", "door"), help="which one --spy records"
    )
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    python = install.python if install is not None else args.triton_venv / "bin" / "python"
    variants = [_variant(v) for v in args.variant]
    sides = args.sides.split(",")
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zade-repo-") as tmp, contextlib.ExitStack() as stack:
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
        servers = []
        for name, extra in variants:
            with _environment(extra):
                target = stack.enter_context(zinfer_front_door(repo, 1))
            assert target.door_pid is not None
            servers.append((name, extra, target, psutil.Process(target.door_pid).ppid()))
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for name, extra, target, root in order:
                for side in sides if r % 2 == 0 else sides[::-1]:
                    spy = None
                    if args.spy is not None:
                        args.spy.mkdir(parents=True, exist_ok=True)
                        pid = root if args.spy_process == "broker" else target.door_pid
                        spy = _spy(pid, args.seconds, args.spy / f"{name}-{side}-{r}-{args.spy_process}.txt")
                    if side == "door":
                        fig = turn(python, target.grpc, args.seconds, root, "zinfer")
                    else:
                        fig = native_turn(target.broker_url, args.seconds, root, extra)
                    if spy is not None:
                        spy.wait(60)
                    rows.setdefault(f"{name} {side}", []).append(fig)
                    if "error" in fig:
                        print(f"round {r} {name} {side} failed: {fig['error'][-400:]}", flush=True)
                        continue
                    cpu = " ".join(f"{k} {v:.0f}" for k, v in fig["server_cpu_us_per_request"].items())
                    rate = f"{fig['throughput_s']:7.1f}/s p50 {fig['p50_us']:7.0f} us"
                    print(f"round {r} {name:8s} {side:6s} {rate} server us/req: {cpu}", flush=True)
    summary: dict[str, Any] = {}
    for key, figs in rows.items():
        ok = [f for f in figs if "error" not in f]
        if not ok:
            continue
        roles = sorted({k for f in ok for k in f["server_cpu_us_per_request"]})
        summary[key] = {
            "throughput_s": round(statistics.median(f["throughput_s"] for f in ok), 1),
            "p50_us": round(statistics.median(f["p50_us"] for f in ok), 1),
            **{f"{k}_cpu_us": _median(ok, k) for k in roles},
        }
        print(f"median {key:16s} {json.dumps(summary[key])}")
    out = {"machine": machine(), "variants": args.variant, "rounds": rows, "median": summary}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
