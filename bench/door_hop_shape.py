"""What door traffic costs the broker and the workers beside the native client's, and why: ``add`` at 32 in
flight through the HTTP (or gRPC) door and from zinfer's ``AsyncClient`` on the broker's socket, same
server, in turns, with the traffic's shape beside the CPU.

Per turn: throughput, p50 (door side: perf_analyzer's), CPU per request by process (door, broker, workers),
and the shape the broker sees: requests per message the sender's ``AsyncConnection`` sends (a BUNDLE carries
several; ``door_ens_shape``'s counting ``sitecustomize``), the mean EXECUTE size and why the batches left
(the broker's statistics: ``batch_reasons``), and the broker's wakes per request (voluntary context
switches: one per loop turn that slept). The door side is perf_analyzer (tritonclient 2.51's) on ``add`` at
concurrency 32 with fixed measurement windows (``--stability-percentage 1000``: a loaded machine never
fails the step); the native side is 32 coroutines on one ``AsyncClient`` for ``--seconds``.

Each variant (``NAME`` or ``NAME:KEY=VALUE,...``, the environment its ``zinfer serve`` starts with, e.g.
``PYTHONPATH=DIR`` for another tree's code) is one server, up for the whole run; variants and sides
alternate order by round. ``--early-off NAME``: that variant's ``add`` has early dispatch off
(``zinfer_early_dispatch: "false"``, Triton's timing), to see what it does to door traffic's batches;
``--doors NAME:N``: that variant's server runs N front-door processes (``--frontdoor-workers``); ``--delay
NAME:US``: that variant's ``add`` waits US µs (``max_queue_delay_microseconds``; the bench's config: 500).

Usage: ``.venv/bin/python bench/door_hop_shape.py --triton-venv DIR [--protocol http|grpc] [--rounds 2]
[--seconds 6] [--variant NAME:PYTHONPATH=TREE ...] [--early-off NAME] [--doors NAME:N] [--delay NAME:US]
[--door-policy NAME:fifo|batch] [--label L]``. Results:
bench/results/door_hop_shape.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from ab_frontdoor_http import _environment, _variant  # noqa: E402
from bench_frontdoor import Target, zinfer_front_door  # noqa: E402
from bench_frontdoor_ensemble import _role, _tree  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402
from door_ens_shape import COUNTER, _counts  # noqa: E402
from pa_latency_parts import _machine_ticks, _pa  # noqa: E402

from zinfer.client import Client  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "door_hop_shape.json"
IN_FLIGHT = 32
EARLY_OFF = 'parameters { key: "zinfer_early_dispatch" value: { string_value: "false" } }\n'

NATIVE = r"""
import asyncio, json, sys, time
import numpy as np
from zinfer.client import AsyncClient

url, seconds, in_flight = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])

async def main():
    client = AsyncClient(url)
    a = np.ones((1, 1), np.float32)
    async def one():
        await client.infer("add", {"INPUT_A": a, "INPUT_B": a})
    for _ in range(20):
        await asyncio.gather(*(one() for _ in range(4)))
    lats = []
    end = time.monotonic() + seconds
    async def loop():
        while time.monotonic() < end:
            t0 = time.perf_counter()
            await one()
            lats.append(time.perf_counter() - t0)
    t0 = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(in_flight)))
    wall = time.monotonic() - t0
    await client.close()
    lats.sort()
    print(json.dumps({"requests": len(lats), "throughput_s": len(lats) / wall,
                      "p50_us": lats[len(lats) // 2] * 1e6}))

asyncio.run(main())
"""


def _perf_analyzer(pa: Path, env: dict[str, str], target: Target, protocol: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zdhs-pa-") as tmp:
        url = target.grpc if protocol == "grpc" else target.http
        row = _pa(pa, env, url, 2500, Path(tmp), protocol)
    return {"throughput_s": row["Inferences/Second"], "p50_us": row["p50 latency"]}


def _stats(url: str) -> tuple[int, int, dict[str, int]]:
    with Client(url) as c:
        body = c.statistics("add")
    s = body["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"]), dict(s.get("batch_reasons", {}))


_POLICIES = {"fifo": (os.SCHED_FIFO, 1), "batch": (os.SCHED_BATCH, 0)}


def _set_door_policy(root: int, policy: str) -> None:
    """Every thread of every door process under ``root`` to ``policy`` (``_POLICIES``)."""
    which, priority = _POLICIES[policy]
    for p in _tree(root):
        if _role(p, root, "zinfer") != "door":
            continue
        for t in p.threads():
            os.sched_setscheduler(t.id, which, os.sched_param(priority))


def _by_role(root: int) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds and voluntary context switches of the server's processes, by role."""
    cpu: dict[str, float] = {}
    wakes: dict[str, int] = {}
    for p in _tree(root):
        try:
            t, role = p.cpu_times(), _role(p, root, "zinfer")
            n = p.num_ctx_switches().voluntary
        except psutil.Error:
            continue
        cpu[role] = cpu.get(role, 0.0) + t.user + t.system
        wakes[role] = wakes.get(role, 0) + n
    return cpu, wakes


def _turn(
    side: str, target: Target, env: dict[str, str], pa: Path, pa_env: dict[str, str], protocol: str,
    seconds: float, counts: Path, root: int,
) -> dict[str, Any]:  # fmt: skip
    c0, (s0, w0) = _counts(counts), _by_role(root)
    b0, t0, k0 = _stats(target.broker_url), time.monotonic(), _machine_ticks()
    if side == "door":
        fig = _perf_analyzer(pa, pa_env, target, protocol)
    else:
        args = [sys.executable, "-c", NATIVE, target.broker_url, str(seconds), str(IN_FLIGHT)]
        with _environment(env):
            run = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120, check=False)
        if run.returncode != 0:
            raise RuntimeError(run.stderr[-1500:])
        fig = json.loads(run.stdout.strip().splitlines()[-1])
    t1, k1 = time.monotonic(), _machine_ticks()
    b1 = _stats(target.broker_url)
    time.sleep(0.7)  # the counters' next write
    c1, (s1, w1) = _counts(counts), _by_role(root)
    # requests answered in the window: the broker's count (both sides; a few warm-up calls are in it)
    n = max(1, b1[0] - b0[0])
    if side == "door":  # every door process of this server (--doors)
        senders = [p.pid for p in _tree(root) if _role(p, root, "zinfer") == "door"]
    else:
        senders = [max(set(c1) - set(c0), default=0)]
    sends = sum(c1.get(s, {}).get("sends", 0) - c0.get(s, {}).get("sends", 0) for s in senders)
    messages = sum(c1.get(s, {}).get("messages", 0) - c0.get(s, {}).get("messages", 0) for s in senders)
    per_send = round(messages / sends, 1) if sends > 0 and messages > 0 else None  # None: a counter unread
    reasons = {k: v - b0[2].get(k, 0) for k, v in b1[2].items() if v - b0[2].get(k, 0)}
    return {
        "throughput_s": round(float(fig["throughput_s"]), 1),
        "p50_us": round(float(fig["p50_us"]), 1),
        "wall_s": round(t1 - t0, 2),
        **{f"{k}_cpu_us": round(1e6 * (s1[k] - s0.get(k, 0.0)) / n, 1) for k in sorted(s1)},
        "requests_per_send": per_send,
        "mean_batch": round(n / max(1, b1[1] - b0[1]), 1),
        "batch_reasons": reasons,
        "broker_wakes_per_request": round((w1.get("broker", 0) - w0.get("broker", 0)) / n, 3),
        "idle_share": round((k1[1] - k0[1]) / max(1, k1[0] - k0[0]), 3),
    }


def _broker_pid(target: Target) -> int:
    """The pid of ``zinfer serve`` behind ``target``: the child of this process with its runtime folder."""
    folder = target.broker_url.removeprefix("ipc://").rsplit("/", 1)[0]
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if folder in p.cmdline():
                return p.pid
    raise RuntimeError(f"no server process for {target.broker_url}")


def _median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(numbers), 2) if numbers else None


def _placeholder(arg: str) -> str:
    """An argument as the results file records it: no paths of the machine it ran on."""
    if arg.startswith("/"):
        return "DIR"
    head, sep, _ = arg.partition("PYTHONPATH=")
    return f"{head}{sep}TREE" if sep else arg


def _with_delay(repo: Path, dest: Path, delay_us: int) -> Path:
    """A copy of ``repo`` whose ``add`` has ``max_queue_delay_microseconds: delay_us``."""
    shutil.copytree(repo, dest)
    add = dest / "add" / "config.pbtxt"
    text, n = re.subn(
        r"max_queue_delay_microseconds: \d+", f"max_queue_delay_microseconds: {delay_us}", add.read_text()
    )
    if n != 1:
        raise SystemExit(f"{add}: no single max_queue_delay_microseconds to change")
    add.write_text(text)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--sides", default="door,native")
    ap.add_argument("--label", default="latest")
    ap.add_argument(
        "--doors",
        action="append",
        default=[],
        help="NAME:N: that variant's server runs N front-door processes",
    )
    ap.add_argument(
        "--early-off", action="append", default=[], help="a variant whose add has zinfer_early_dispatch false"
    )
    ap.add_argument(
        "--delay", action="append", default=[], help="NAME:US: that variant's add has max_queue_delay US µs"
    )
    ap.add_argument(
        "--door-cpus", action="append", default=[], help="NAME:LIST: that variant's doors pinned to LIST"
    )
    ap.add_argument(
        "--door-policy",
        action="append",
        default=[],
        help="NAME:fifo|batch: every thread of that variant's doors under that scheduling policy",
    )
    args = ap.parse_args()
    args.door_policy = dict(d.split(":", 1) for d in args.door_policy)
    if not set(args.door_policy.values()) <= _POLICIES.keys():
        raise SystemExit(f"--door-policy: one of {sorted(_POLICIES)}")
    args.door_cpus = dict(d.split(":", 1) for d in args.door_cpus)
    args.doors = {k: int(v) for k, v in (d.split(":") for d in args.doors)}
    args.delay = {k: int(v) for k, v in (d.split(":") for d in args.delay)}
    install = triton_side.find(args.triton_venv)
    if install is None:
        raise SystemExit(f"no Triton in {args.triton_venv}")
    pa = args.triton_venv / "bin" / "perf_analyzer"
    variants = [_variant(v) for v in args.variant] or [("here", {})]
    sides = args.sides.split(",")
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zdhs-") as tmp, contextlib.ExitStack() as stack:
        site, counts = Path(tmp) / "site", Path(tmp) / "counts"
        site.mkdir()
        counts.mkdir()
        (site / "sitecustomize.py").write_text(f"OUT = {str(counts)!r}\n" + COUNTER)
        (Path(tmp) / "env").mkdir()
        pa_env = triton_side._environment(install, Path(tmp) / "env")
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=True)
        repo_off = vs_triton_repo.write(Path(tmp) / "models-early-off", zinfer_only=True)
        add = repo_off / "add" / "config.pbtxt"
        add.write_text(add.read_text() + EARLY_OFF)
        servers = []
        for name, extra in variants:
            env = dict(extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), extra.get("PYTHONPATH", "")) if p)
            served = repo_off if name in args.early_off else repo
            if name in args.delay:  # a copy of the repository whose add waits another queue delay
                served = _with_delay(served, Path(tmp) / f"models-{name}", args.delay[name])
            with _environment(env):
                door = zinfer_front_door(served, args.doors.get(name, 1), args.door_cpus.get(name))
                target = stack.enter_context(door)
            servers.append((name, env, target, _broker_pid(target)))
            if name in args.door_policy:
                _set_door_policy(servers[-1][3], args.door_policy[name])
        for r in range(args.rounds):
            for name, env, target, root in servers if r % 2 == 0 else servers[::-1]:
                for side in sides if r % 2 == 0 else sides[::-1]:
                    fig = _turn(side, target, env, pa, pa_env, args.protocol, args.seconds, counts, root)
                    rows.setdefault(f"{name}/{side}", []).append(fig)
                    print(f"round {r} {name} {side:6s} {json.dumps(fig)}", flush=True)
    medians = {
        key: {k: _median([f[k] for f in figs]) for k, v in figs[0].items() if not isinstance(v, dict)}
        for key, figs in rows.items()
    }
    for key, m in medians.items():
        print(f"median {key:16s} {json.dumps(m)}")
    doc: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.setdefault("runs", {})[args.label] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["bench/door_hop_shape.py", *(_placeholder(a) for a in sys.argv[1:])]),
        "machine": machine(),
        "params": {
            "early_off": args.early_off,
            "delay_us": args.delay,
            "doors": args.doors,
            "door_policy": args.door_policy,
            "protocol": args.protocol,
            "rounds": args.rounds,
            "seconds": args.seconds,
            "in_flight": IN_FLIGHT,
        },  # fmt: skip
        "medians": medians,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
