"""How much of the time a server's work runs alone: the machine's CPUs, scheduler event by scheduler event,
while perf_analyzer drives ``add`` over HTTP at concurrency 32 (issue 33's HTTP c32 step), Triton and zinfer
one after the other on the same repository (``vs_triton_repo``).

``perf sched record -a`` takes every context switch of a short window. Replayed, it says at each moment how
many CPUs ran something and what: the share of the window with every CPU busy, with some idle and which
process ran alone then (a stage of the request's cycle that nothing overlapped), and with none busy. Each
process is named by its role: zinfer's broker, door and worker (``/t``: its other threads, ZeroMQ's I/O
thread among them), Triton's ``tritonserver`` and its python-backend stub; perf_analyzer as itself.

A closed loop of 32 requests makes a cycle: where one stage runs alone the others wait on it, so the share
run alone is the part of the cycle that is serial. ``perf sched`` needs ``perf`` and the rights to trace the
scheduler (root here); the window is short because every switch is a record.

Usage: ``.venv/bin/python bench/serial_share.py --triton-venv DIR [--seconds 1.5] [--label L]``
(``PYTHONPATH=TREE`` for another zinfer tree, e.g. a compiled build). Results:
bench/results/serial_share.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, MODELS, Target, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "serial_share.json"
_SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:.*next_comm=(.+?) next_pid=(\d+)")
_WAKING = re.compile(r"\[\d+\]\s+([\d.]+):\s+sched:sched_waking:.*? pid=(\d+)")


def _roles_zinfer(target: Target) -> dict[int, str]:
    """Every thread of the server by role: broker, door, worker (the ``add`` model's), ``/t`` for the
    threads that are not a process's main one."""
    assert target.door_pid is not None
    door = psutil.Process(target.door_pid)
    broker = psutil.Process(door.ppid())
    procs = {broker.pid: "broker", door.pid: "door"}
    for child in broker.children():
        if child.pid != door.pid:
            procs[child.pid] = "worker" if "add" in " ".join(child.cmdline()) else "other worker"
    return _threads(procs)


def _roles_triton(pid: int) -> dict[int, str]:
    server = psutil.Process(pid)
    procs = {pid: "tritonserver"}
    for child in server.children(recursive=True):
        procs[child.pid] = "stub" if "stub" in child.name() else child.name()
    return _threads(procs)


def _threads(procs: dict[int, str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for pid, role in procs.items():
        try:
            for t in psutil.Process(pid).threads():
                out[t.id] = role if t.id == pid else f"{role}/t"
        except psutil.Error:
            continue
    return out


def _top(d: dict[str, float], n: int) -> list[tuple[str, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])[:n]


def shares(perf_data: Path, roles: dict[int, str], cpus: int) -> dict[str, Any]:
    """The window's time by how many CPUs were busy, what ran alone, and each role's busy share."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "cpu,time,event,trace"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    running: dict[int, str] = {}
    prev: float | None = None
    by_busy: dict[int, float] = collections.defaultdict(float)
    alone: dict[str, float] = collections.defaultdict(float)
    busy: dict[str, float] = collections.defaultdict(float)
    woken: dict[int, float] = {}
    waits: dict[str, list[float]] = collections.defaultdict(list)
    for line in out.splitlines():
        m = _SWITCH.match(line)
        if m is None:
            w = _WAKING.match(line)
            if w is not None:
                woken.setdefault(int(w.group(2)), float(w.group(1)))
            continue
        cpu, t, comm, pid = int(m.group(1)), float(m.group(2)), m.group(3), int(m.group(4))
        since = woken.pop(pid, None)
        if since is not None and pid in roles:
            waits[roles[pid]].append(t - since)
        if len(running) == cpus and prev is not None:
            span = t - prev
            now = [r for r in running.values() if r != "idle"]
            by_busy[len(now)] += span
            if len(now) == 1 and cpus > 1:
                alone[now[0]] += span
            for r in now:
                busy[r] += span
        running[cpu] = "idle" if pid == 0 else roles.get(pid, comm)
        prev = t
    total = sum(by_busy.values()) or 1.0
    return {
        "window_s": round(total, 3),
        "cpus_busy_share": {str(k): round(v / total, 3) for k, v in sorted(by_busy.items())},
        "alone_share": {k: round(v / total, 3) for k, v in _top(alone, 8) if v / total >= 0.001},
        "busy_share": {k: round(v / total, 3) for k, v in _top(busy, 10) if v / total >= 0.001},
        # from a wake-up to running: the mean, over the window's wake-ups of each role's threads
        "wake_to_run_us": {
            k: round(1e6 * sum(v) / len(v), 1) for k, v in sorted(waits.items()) if len(v) >= 20
        },
    }


def measure(pa: Path, env: dict[str, str], target: Target, roles: dict[int, str], seconds: float,
            tmp: Path) -> dict[str, Any]:  # fmt: skip
    """The window's shares under perf_analyzer's load, tried again once when perf_analyzer gives no figure
    (its measuring thread stalls now and then on this machine)."""
    for _ in range(2):
        out = _window(pa, env, target, roles, seconds, tmp)
        if out["throughput_s"] is not None:
            return out
    return out


def _window(pa: Path, env: dict[str, str], target: Target, roles: dict[int, str], seconds: float,
            tmp: Path) -> dict[str, Any]:  # fmt: skip
    fig: dict[str, Any] = {}

    def load() -> None:
        try:
            fig.update(perf_analyzer(pa, env, target, "http", "add", 32, ADD_SHAPES, 1500))
        except (RuntimeError, subprocess.SubprocessError) as exc:  # no figure: the window is not used
            print(f"perf_analyzer on {target.name}: {str(exc)[:200]}")

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(2.5)  # perf_analyzer's warm-up and first window
    data = tmp / f"{target.name}.data"
    subprocess.run(["perf", "sched", "record", "-a", "-o", str(data), "--", "sleep", str(seconds)],
                   capture_output=True, check=True)  # fmt: skip
    thread.join(300)
    out = shares(data, roles, psutil.cpu_count() or 1)
    out["throughput_s"] = fig.get("throughput_s")
    return out


def _io_threads(roles: dict[int, str], root_roles: tuple[str, ...]) -> list[int]:
    """The ZeroMQ I/O threads (``ZMQbg/IO/N``) of the server's processes of ``root_roles``."""
    out = []
    for tid, role in roles.items():
        if role.split("/")[0] in root_roles and role.endswith("/t"):
            try:
                if Path(f"/proc/{tid}/comm").read_text().startswith("ZMQbg/IO"):
                    out.append(tid)
            except OSError:
                continue
    return out


def _set_policy(tids: list[int], fifo: bool) -> None:
    policy, priority = (os.SCHED_FIFO, 1) if fifo else (os.SCHED_OTHER, 0)
    for tid in tids:
        os.sched_setscheduler(tid, policy, os.sched_param(priority))


def io_fifo_turns(pa: Path, env: dict[str, str], target: Target, roles: dict[int, str], seconds: float,
                  tmp: Path, rounds: int) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """zinfer as built and with its broker's, door's and ``add`` worker's ZeroMQ I/O threads under
    ``SCHED_FIFO`` (priority 1: they run as soon as they are woken), a window each in turns."""
    tids = _io_threads(roles, ("broker", "door", "worker"))
    out: dict[str, list[dict[str, Any]]] = {"as built": [], "io threads fifo": []}
    try:
        for _ in range(rounds):
            for name, fifo in (("as built", False), ("io threads fifo", True)):
                _set_policy(tids, fifo)
                out[name].append(measure(pa, env, target, roles, seconds, tmp))
    finally:
        _set_policy(tids, False)
    return out


def _print(name: str, r: dict[str, Any]) -> None:
    print(f"{name}: {r['throughput_s']}/s (perf_analyzer, the window's measurement included)")
    print("  CPUs busy: " + ", ".join(f"{k}: {v:.1%}" for k, v in r["cpus_busy_share"].items()))
    print("  alone: " + ", ".join(f"{k} {v:.1%}" for k, v in r["alone_share"].items()))
    print("  busy: " + ", ".join(f"{k} {v:.1%}" for k, v in r["busy_share"].items()))
    print("  wake to run, mean us: " + ", ".join(f"{k} {v:.0f}" for k, v in r["wake_to_run_us"].items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="pytriton 0.7.0, tritonclient 2.51")
    ap.add_argument("--seconds", type=float, default=1.5, help="the recorded window")
    ap.add_argument("--label", default="latest")
    ap.add_argument(
        "--io-threads-fifo",
        action="store_true",
        help="zinfer only: windows in turns as built and with its ZeroMQ I/O threads SCHED_FIFO",
    )
    ap.add_argument("--rounds", type=int, default=3, help="turns of --io-threads-fifo")
    args = ap.parse_args()
    pa = args.triton_venv / "bin" / "perf_analyzer"
    if not pa.exists():
        print("no perf_analyzer (tritonclient 2.51's wheel, see --triton-venv): nothing to measure with")
        return 1
    install = triton_side.find(args.triton_venv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zss-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env").mkdir()
        env = triton_side._environment(install or triton_side.TritonInstall(
            args.triton_venv, args.triton_venv / "bin" / "python", Path()), tmp / "env")  # fmt: skip
        repo = vs_triton_repo.write(tmp / "models", zinfer_only=False)
        if install is not None and not args.io_threads_fifo:
            with triton_side.serve(install, repo, MODELS) as s:
                triton = Target("triton", s.grpc, s.http)
                result["triton"] = measure(pa, env, triton, _roles_triton(s.pid), args.seconds, tmp)
        with zinfer_front_door(repo, 1) as target:
            roles = _roles_zinfer(target)
            if args.io_threads_fifo:
                turns = io_fifo_turns(pa, env, target, roles, args.seconds, tmp, args.rounds)
            else:
                result["zinfer"] = measure(pa, env, target, roles, args.seconds, tmp)
    if args.io_threads_fifo:
        for name, windows in turns.items():
            for k, r in enumerate(windows):
                _print(f"zinfer {name}, round {k}", r)
        command = (f"bench/serial_share.py --triton-venv DIR --seconds {args.seconds:g} --io-threads-fifo "
                   f"--rounds {args.rounds} --label {args.label}")  # fmt: skip
        record_run(RESULTS, args.label, command, {"turns": turns})
        return 0
    for name, r in result.items():
        _print(name, r)
    if "triton" in result:
        one = {k: r["cpus_busy_share"].get("1", 0.0) for k, r in result.items()}
        print(f"one CPU idle: zinfer {one['zinfer']:.1%} of the window, Triton {one['triton']:.1%}")
    command = f"bench/serial_share.py --triton-venv DIR --seconds {args.seconds:g} --label {args.label}"
    record_run(RESULTS, args.label, command, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
