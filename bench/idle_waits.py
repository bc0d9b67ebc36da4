"""Idle CPU beside waiting threads at HTTP c32: who waited on a run queue while the other CPU sat idle,
zinfer's front door beside Triton.

At HTTP c32 perf_analyzer measures zinfer's door a few percent behind Triton while the machine's CPU time per
request is about the same for both (``pa_latency_parts``): the difference is idle time. This records the
scheduler (``perf sched record -a``) for ``--seconds`` in the middle of a perf_analyzer run on ``add`` at
concurrency 32 over HTTP, once against Triton 2.51 and once against ``zinfer serve --http`` (one door), and
reads its switch and wake-up events (``perf script``: ``perf sched timehist`` loses one CPU's idle time on
this machine, folding it into the run time of whatever ran next):

* each CPU's idle time over the recording;
* CPU time by role (zinfer: ``door``, ``broker``, ``workers``; Triton: ``tritonserver``, ``stubs``; both:
  ``perf_analyzer``, ``other``), and on which CPU;
* run-queue waits (a thread woken or preempted, not yet running) by role, and the part of them during which
  the CPU it was queued on was busy while the *other* CPU was idle: work that could have run at once, had
  the scheduler put it there (thread time: summed over the threads that waited); and the wall time one
  CPU was idle while the other, busy, had a thread queued (``idle_beside_queued_work``);
* what ran alone, every other CPU idle, by role (``alone``): a stage of the request's cycle that nothing
  overlapped, the others waiting on it; and each role's mean run-queue wait.

``--io-threads-fifo`` measures zinfer alone instead, ``--rounds`` windows in turns on one server: as built,
and with the ZeroMQ I/O threads (``ZMQbg/IO``) of its broker, door and workers under ``SCHED_FIFO`` at
priority 1, so that they run as soon as they are woken.

Every figure is per second of the recording. Usage: ``.venv/bin/python bench/idle_waits.py --triton-venv DIR
[--seconds 1.5] [--label L] [--io-threads-fifo --rounds 3]`` (``PYTHONPATH=TREE`` for another zinfer tree,
e.g. a compiled build; needs ``perf`` and the right to record scheduler events, and root for the FIFO
turns). Results: bench/results/idle_waits.json (an entry per
``--label``).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import MODELS, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402
from door_hop_shape import _broker_pid  # noqa: E402
from pa_latency_parts import _pa  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "idle_waits.json"
SETTLE_S = 6.0  # into perf_analyzer's run before recording (its first window is 3 s)
_SWITCH = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=.*? prev_pid=(\d+) prev_prio=\S+ "
    r"prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+) "
)
_WAKING = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_waking: comm=(.*?) pid=(\d+) prio=\S+ target_cpu=(\d+)"
)


@dataclass(frozen=True)
class Span:
    """``tid`` (0: the CPU idle) on ``cpu`` from ``start`` to ``end`` (seconds); for a wait: queued there."""

    cpu: int
    tid: int
    start: float
    end: float


def parse(text: str) -> tuple[list[Span], list[Span], dict[int, str]]:
    """``perf script`` lines of ``sched_switch`` and ``sched_waking`` as (runs, idle included; run-queue
    waits: from a wake-up or a preemption to the next time the thread runs; each thread's last name)."""
    runs: list[Span] = []
    waits: list[Span] = []
    names: dict[int, str] = {}
    current: dict[int, tuple[int, float]] = {}
    queued: dict[int, tuple[int, float]] = {}
    for line in text.splitlines():
        m = _SWITCH.match(line)
        if m:
            cpu, t, prev, state, next_name, nxt = (int(m[1]), float(m[2]), int(m[3]), m[4], m[5], int(m[6]))
            tid, since = current.get(cpu, (prev, t))
            runs.append(Span(cpu, tid, since, t))
            current[cpu] = (nxt, t)
            names[nxt] = next_name
            if prev and state.startswith("R"):  # preempted: runnable from now
                queued.setdefault(prev, (cpu, t))
            if nxt and nxt in queued:
                qcpu, qt = queued.pop(nxt)
                waits.append(Span(qcpu, nxt, qt, t))
            continue
        m = _WAKING.match(line)
        if m and int(m[4]) not in {tid for tid, _ in current.values()}:
            names[int(m[4])] = m[3]
            queued.setdefault(int(m[4]), (int(m[5]), float(m[2])))
    return runs, waits, names


class Idle:
    """One CPU's idle spans, sorted, for overlap queries."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = sorted((s.start, s.end) for s in spans)
        self.starts = [a for a, _ in self.spans]

    def within(self, a: float, b: float) -> list[tuple[float, float]]:
        """The parts of ``[a, b]`` this CPU was idle."""
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        out = []
        while i < len(self.spans) and self.spans[i][0] < b:
            s, e = self.spans[i]
            if e > a:
                out.append((max(a, s), min(b, e)))
            i += 1
        return out


def _busy_beside_idle(idle: dict[int, Idle], cpu: int, a: float, b: float) -> float:
    """How long, within ``[a, b]``, ``cpu`` was busy while another CPU was idle."""
    total = 0.0
    for other, spans in idle.items():
        if other == cpu:
            continue
        for s, e in spans.within(a, b):
            total += (e - s) - sum(y - x for x, y in idle[cpu].within(s, e))
    return total


def _others_idle(idle: dict[int, Idle], cpu: int, a: float, b: float) -> float:
    """How long, within ``[a, b]``, every CPU but ``cpu`` was idle."""
    parts = [(a, b)]
    for other, spans in idle.items():
        if other != cpu:
            parts = [x for s, e in parts for x in spans.within(s, e)]
    return sum(e - s for s, e in parts)


def summarize(text: str, role_of: dict[int, str]) -> dict[str, Any]:
    """The figures the module docstring names, per second of the recording, in ms."""
    runs, waits, names = parse(text)
    if not runs:
        raise RuntimeError("perf sched recorded nothing")
    span = max(r.end for r in runs) - min(r.start for r in runs)
    cpus = sorted({r.cpu for r in runs})
    idle = {c: Idle([r for r in runs if r.cpu == c and r.tid == 0]) for c in cpus}

    def role(tid: int) -> str:
        return role_of.get(
            tid, "perf_analyzer" if names.get(tid, "").startswith("perf_analyzer") else "other"
        )

    run: dict[str, dict[int, float]] = collections.defaultdict(lambda: dict.fromkeys(cpus, 0.0))
    alone: dict[str, float] = collections.defaultdict(float)
    for r in runs:
        if r.tid:
            run[role(r.tid)][r.cpu] += r.end - r.start
            alone[role(r.tid)] += _others_idle(idle, r.cpu, r.start, r.end)
    queue: dict[str, float] = collections.defaultdict(float)
    queued: collections.Counter[str] = collections.Counter()
    beside_idle: dict[str, float] = collections.defaultdict(float)
    for w in waits:
        queue[role(w.tid)] += w.end - w.start
        queued[role(w.tid)] += 1
        beside_idle[role(w.tid)] += _busy_beside_idle(idle, w.cpu, w.start, w.end)

    # wall time (not thread time) a CPU was idle while the other, busy, had a thread queued
    misplaced = 0.0
    for c in cpus:
        merged: list[list[float]] = []
        for w in sorted((w for w in waits if w.cpu == c), key=lambda w: w.start):
            if merged and w.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], w.end)
            else:
                merged.append([w.start, w.end])
        misplaced += sum(_busy_beside_idle(idle, c, a, b) for a, b in merged)

    def per_s(x: float) -> float:
        return round(x / span * 1e3, 1)

    return {
        "recorded_s": round(span, 3),
        "idle_ms_per_s": {str(c): per_s(sum(e - s for s, e in idle[c].spans)) for c in cpus},
        "run_ms_per_s": {k: {str(c): per_s(v) for c, v in by.items()} for k, by in sorted(run.items())},
        "runqueue_wait_ms_per_s": {k: per_s(v) for k, v in sorted(queue.items())},
        "wait_beside_idle_cpu_ms_per_s": {k: per_s(v) for k, v in sorted(beside_idle.items())},
        "wait_beside_idle_cpu_total_ms_per_s": per_s(sum(beside_idle.values())),
        "idle_beside_queued_work_ms_per_s": per_s(misplaced),
        "alone_ms_per_s": {k: per_s(v) for k, v in sorted(alone.items()) if per_s(v)},
        "alone_total_ms_per_s": per_s(sum(alone.values())),
        "runqueue_wait_mean_us": {k: round(queue[k] / n * 1e6, 1) for k, n in sorted(queued.items())},
    }


def _roles(root: int, side: str) -> dict[int, str]:
    """Each thread id of the side's server processes, to its role (taken once the server is up: the threads
    that serve are made at start)."""
    procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    out: dict[int, str] = {}
    for p in procs:
        try:
            door = "zinfer.frontdoor.process" in " ".join(p.cmdline())
            threads = [t.id for t in p.threads()]
        except psutil.Error:
            continue
        if p.pid == root:
            role = "tritonserver" if side == "triton" else "broker"
        else:
            role = "stubs" if side == "triton" else "door" if door else "workers"
        out.update(dict.fromkeys(threads, role))
    return out


@contextmanager
def _server(side: str, install: triton_side.TritonInstall, repo: Path) -> Iterator[tuple[str, int]]:
    """(HTTP address, root pid) of the side's server, up until the block ends."""
    if side == "triton":
        with triton_side.serve(install, repo, MODELS) as t:
            yield t.http, t.pid
    else:
        with zinfer_front_door(repo, 1) as z:
            yield z.http, _broker_pid(z)


def measure(side: str, install: triton_side.TritonInstall, tmp: Path, seconds: float) -> dict[str, Any]:
    pa = install.venv / "bin" / "perf_analyzer"
    (tmp / f"env-{side}").mkdir()
    env = triton_side._environment(install, tmp / f"env-{side}")
    repo = vs_triton_repo.write(tmp / f"models-{side}", zinfer_only=side == "zinfer")
    with _server(side, install, repo) as (http, root):
        return _window(pa, env, http, _roles(root, side), seconds, tmp / f"sched-{side}.data", tmp)


def _window(
    pa: Path, env: dict[str, str], http: str, roles: dict[int, str], seconds: float, data: Path, tmp: Path
) -> dict[str, Any]:
    """The figures of one recording in the middle of one perf_analyzer run against ``http``; taken once more
    when perf_analyzer gives no figure (its measuring thread stalls now and then on this machine)."""
    try:
        return _window_once(pa, env, http, roles, seconds, data, tmp)
    except RuntimeError as exc:
        print(f"no figure, once more: {str(exc)[:200]}")
        return _window_once(pa, env, http, roles, seconds, data, tmp)


def _window_once(
    pa: Path, env: dict[str, str], http: str, roles: dict[int, str], seconds: float, data: Path, tmp: Path
) -> dict[str, Any]:
    row: dict[str, float] = {}
    errors: list[BaseException] = []

    def load() -> None:
        try:
            row.update(_pa(pa, env, http, 3000, tmp))
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    runner = threading.Thread(target=load)
    runner.start()
    time.sleep(SETTLE_S)
    rec = ["perf", "sched", "record", "-a", "-o", str(data), "--", "sleep", str(seconds)]
    subprocess.run(rec, capture_output=True, check=True, timeout=seconds + 60)
    runner.join(300)
    if errors or runner.is_alive():
        raise RuntimeError(f"perf_analyzer failed: {errors[:1] or 'still running after 300 s'}")
    script = ["perf", "script", "-i", str(data), "-F", "cpu,time,event,trace"]
    events = subprocess.run(script, capture_output=True, text=True, check=True, timeout=300)
    out = summarize(events.stdout, roles)
    out["perf_analyzer_infer_per_s"] = row.get("Inferences/Second")
    return out


def _io_threads(roles: dict[int, str]) -> list[int]:
    """The ZeroMQ I/O threads (``ZMQbg/IO/N``) among the server's threads."""
    out = []
    for tid in roles:
        try:
            if Path(f"/proc/{tid}/comm").read_text().startswith("ZMQbg/IO"):
                out.append(tid)
        except OSError:  # ended meanwhile
            continue
    return out


def _set_policy(tids: list[int], fifo: bool) -> None:
    policy, priority = (os.SCHED_FIFO, 1) if fifo else (os.SCHED_OTHER, 0)
    for tid in tids:
        os.sched_setscheduler(tid, policy, os.sched_param(priority))


def io_fifo_turns(
    install: triton_side.TritonInstall, tmp: Path, seconds: float, rounds: int
) -> dict[str, Any]:
    """zinfer as built and with its ZeroMQ I/O threads under ``SCHED_FIFO`` (priority 1), a window each in
    turns on one server."""
    pa = install.venv / "bin" / "perf_analyzer"
    (tmp / "env").mkdir()
    env = triton_side._environment(install, tmp / "env")
    repo = vs_triton_repo.write(tmp / "models", zinfer_only=True)
    turns: dict[str, list[dict[str, Any]]] = {"as built": [], "io threads fifo": []}
    with _server("zinfer", install, repo) as (http, root):
        roles = _roles(root, "zinfer")
        tids = _io_threads(roles)
        try:
            for k in range(rounds):
                for name, fifo in (("as built", False), ("io threads fifo", True)):
                    _set_policy(tids, fifo)
                    turns[name].append(_window(pa, env, http, roles, seconds, tmp / "sched.data", tmp))
                    _print(f"zinfer {name}, round {k}", turns[name][-1])
        finally:
            _set_policy(tids, False)
    return {"io_threads": len(tids), "turns": turns}


def _print(name: str, s: dict[str, Any]) -> None:
    print(f"{name}: {s['perf_analyzer_infer_per_s']}/s, idle ms/s by cpu {s['idle_ms_per_s']}")
    total, by_role = s["wait_beside_idle_cpu_total_ms_per_s"], s["wait_beside_idle_cpu_ms_per_s"]
    print(f"  run-queue waits beside an idle cpu: {total} ms/s {by_role}")
    print(f"  a cpu idle while the other had a thread queued: {s['idle_beside_queued_work_ms_per_s']} ms/s")
    print(f"  alone, every other cpu idle: {s['alone_total_ms_per_s']} ms/s {s['alone_ms_per_s']}")
    print(f"  mean run-queue wait: {s['runqueue_wait_mean_us']} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--label", default="latest")
    ap.add_argument(
        "--io-threads-fifo", action="store_true", help="zinfer only: as built and I/O threads FIFO"
    )
    ap.add_argument("--rounds", type=int, default=3, help="turns of --io-threads-fifo")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    if install is None:
        raise SystemExit(f"no Triton in {args.triton_venv}")
    command = f"bench/idle_waits.py --triton-venv DIR --seconds {args.seconds} --label {args.label}"
    if args.io_threads_fifo:
        with tempfile.TemporaryDirectory(prefix="ziw-") as name:
            entry = io_fifo_turns(install, Path(name), args.seconds, args.rounds)
        command += f" --io-threads-fifo --rounds {args.rounds}"
        record_run(RESULTS, args.label, command, {"seconds": args.seconds, **entry})
        return 0
    sides: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ziw-") as name:
        tmp = Path(name)
        for side in ("triton", "zinfer"):
            sides[side] = measure(side, install, tmp, args.seconds)
            _print(side, sides[side])
    record_run(RESULTS, args.label, command, {"seconds": args.seconds, "sides": sides})
    return 0


if __name__ == "__main__":
    sys.exit(main())
