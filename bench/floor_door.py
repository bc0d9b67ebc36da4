"""What the front door's design leaves: Triton's HTTP at concurrency 32 against zinfer's HTTP door answering
a recorded reply (the HTTP stack, the conversion and the reply's encoding, no broker) and the full door, in
turns in one run, with the server CPU per request of every process.

Three servers are up at once, each driven in turn by the same ``perf_analyzer`` (tritonclient 2.51's) on
``add`` over HTTP at concurrency 32, for ``--rounds`` rounds (the order reversed every other round):

* ``triton``: tritonserver 2.51 on ``vs_triton_repo``'s repository (``add``: a ``TritonPythonModel``,
  preferred [16, 32, 64], delay 500 us); CPU of tritonserver and its Python stubs;
* ``door-alone``: ``zinfer serve --http`` with ``ZINFER_FRONTDOOR_SHORTCUT=1`` (``frontdoor/shortcut.py``):
  the door answers from a recorded reply (one call in 50 still goes to the broker, in the background);
* ``zinfer``: the full door, broker and worker.

Server CPU per request of a process: its user + system time over the step, over the step's wall time
times perf_analyzer's rate (as ``bench_frontdoor.py`` counts the door's). The floor of the door path is
``door-alone`` plus the floor relay's client side (the door's half of the hop), broker and worker at c32
(``floor_relay.py``'s ``numpy`` level, its ``c32`` load with BUNDLEs and its ``c32s`` load without, read
from bench/results/floor_relay.json when it is there); what is left of Triton's CPU per request once
the door alone is paid is the budget the hop, the broker and the worker have if zinfer is to match
Triton's rate on the same cores.

Usage: ``.venv/bin/python bench/floor_door.py --triton-venv DIR [--rounds 3] [--interval-ms 2000]
[--protocol http|grpc] [--label L]`` (gRPC: the same three over gRPC).
Results: bench/results/floor_door.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "floor_door.json"
FLOOR = ROOT / "bench" / "results" / "floor_relay.json"
SHORTCUT = "ZINFER_FRONTDOOR_SHORTCUT"
CONCURRENCY = 32


def _roles(root_pid: int, door_pid: int | None) -> dict[str, list[psutil.Process]]:
    """A server's processes by role: zinfer's door, broker and workers; Triton's server and stubs."""
    root = psutil.Process(root_pid)
    kids = root.children(recursive=True)
    if door_pid is None:
        return {"server": [root], "stubs": kids}
    return {
        "door": [p for p in kids if p.pid == door_pid],
        "broker": [root],
        "workers": [p for p in kids if p.pid != door_pid],
    }


def _cpu(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    out = {}
    for role, procs in roles.items():
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        out[role] = total
    return out


def step(
    pa: Path, env: dict[str, str], target: Target, root_pid: int, interval_ms: int, protocol: str
) -> dict[str, Any]:
    roles = _roles(root_pid, target.door_pid)
    c0, t0 = _cpu(roles), time.monotonic()
    fig = perf_analyzer(pa, env, target, protocol, "add", CONCURRENCY, ADD_SHAPES, interval_ms)
    c1, t1 = _cpu(roles), time.monotonic()
    n = (t1 - t0) * fig["throughput_s"]
    per = {f"{k}_us": round(1e6 * (c1[k] - c0[k]) / n, 1) for k in c0}
    return {"throughput_s": fig["throughput_s"], "p50_us": fig["p50_us"], **per,
            "server_total_us": round(sum(per.values()), 1)}  # fmt: skip


def floor_relay_c32() -> dict[str, Any] | None:
    """The floor relay's CPU per request by process at c32, bundled and not (numpy level), from its runs."""
    if not FLOOR.exists():
        return None
    out = {}
    for run in json.loads(FLOOR.read_text()).get("runs", {}).values():
        for key, m in run["medians"].items():
            if key.endswith(("/c32/numpy", "/c32s/numpy")):
                out[key] = {k: m[k] for k in ("broker_us", "worker_us", "client_us")}
    return out or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval-ms", type=int, default=2000)
    ap.add_argument("--label", default="latest")
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    if install is None:
        raise SystemExit(f"no Triton in {args.triton_venv}")
    pa = args.triton_venv / "bin" / "perf_analyzer"
    t_start = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zfd-floor-") as tmp, contextlib.ExitStack() as stack:
        tri_repo = vs_triton_repo.write(Path(tmp) / "triton", zinfer_only=False)
        z_repo = vs_triton_repo.write(Path(tmp) / "zinfer", zinfer_only=True)
        ts = stack.enter_context(triton_side.serve(install, tri_repo, ("add",)))
        os.environ[SHORTCUT] = "1"
        alone = stack.enter_context(zinfer_front_door(z_repo, 1))
        os.environ.pop(SHORTCUT, None)
        full = stack.enter_context(zinfer_front_door(z_repo, 1))
        sides: list[tuple[str, Target, int]] = [("triton", Target("triton", ts.grpc, ts.http), ts.pid)]
        for name, t in (("door-alone", alone), ("zinfer", full)):
            if t.door_pid is None:
                raise SystemExit("expected one front-door process")
            sides.append((name, t, psutil.Process(t.door_pid).ppid()))
        for r in range(args.rounds):
            for name, target, pid in sides if r % 2 == 0 else sides[::-1]:
                fig = step(pa, ts.env, target, pid, args.interval_ms, args.protocol)
                runs.setdefault(name, []).append(fig)
                print(f"round {r} {name}: {json.dumps(fig)}", flush=True)
    med = {
        name: {k: round(statistics.median(f[k] for f in figs), 1) for k in figs[0]}
        for name, figs in runs.items()
    }
    tri, alone_m = med["triton"]["server_total_us"], med["door-alone"]
    door_alone = alone_m.get("door_us", 0.0)
    reading = {
        "triton_server_cpu_us": tri,
        "door_alone_cpu_us": door_alone,
        "door_alone_over_triton_cpu": round(door_alone / tri, 2) if tri else None,
        "left_for_hop_broker_worker_us": round(tri - door_alone, 1),
        "zinfer_server_cpu_us": med["zinfer"]["server_total_us"],
        "zinfer_over_triton_cpu": round(med["zinfer"]["server_total_us"] / tri, 2) if tri else None,
        "rate_door_alone_over_triton": round(alone_m["throughput_s"] / med["triton"]["throughput_s"], 2),
        "rate_zinfer_over_triton": round(med["zinfer"]["throughput_s"] / med["triton"]["throughput_s"], 2),
        "floor_relay_c32": floor_relay_c32(),
    }
    for name, m in med.items():
        cpu = " ".join(f"{k[:-3]} {v:.0f}" for k, v in m.items() if k.endswith("_us") and k != "p50_us")
        print(f"{name:<11} {m['throughput_s']:>8.0f}/s  p50 {m['p50_us']:>7.0f} us  server CPU us/req: {cpu}")
    print(json.dumps(reading, indent=2))
    doc: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.setdefault("runs", {})[args.label] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(
            ["bench/floor_door.py", *(("DIR" if a.startswith("/") else a) for a in sys.argv[1:])]
        ),
        "machine": machine(),
        "params": {
            "rounds": args.rounds,
            "interval_ms": args.interval_ms,
            "concurrency": CONCURRENCY,
            "protocol": args.protocol,
        },  # fmt: skip
        "medians": med,
        "reading": reading,
        "runs": runs,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
