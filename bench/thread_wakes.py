"""How often each thread wakes per request at concurrency 1, and what each wake costs: the bare relay and
zinfer's ``add0`` in turns, in one run.

For every thread of the three processes (client, broker or forwarder, worker) it reads the kernel's
counters over a window of a closed loop with one request in flight: voluntary context switches (the
thread slept and was woken), involuntary ones (it was runnable and switched out) and CPU time
(``/proc/PID/task/TID/schedstat``), each per request. The bare relay is ``baseline.bare_hop`` driven by
``baseline.bare_latency_us`` with a real ``add`` request's frames; zinfer is ``zinfer serve`` on
bench_vs_triton's repository driven by ``zinfer_side.sync_latency`` (one sync ``Client``). Threads are
grouped by role: each process's main thread and its ZeroMQ I/O thread (``ZMQbg/IO/0``); threads that
hardly ran are left out. The levels alternate within each round, the order reversed every other round.

Usage: ``PYTHONPATH=TREE .venv/bin/python bench/thread_wakes.py [--rounds 3] [--seconds 4] [--label L]``
(TREE a compiled build, ``bench_compiled.build_compiled``, or nothing for this checkout). Results:
bench/results/thread_wakes.json, one entry per label.
"""

from __future__ import annotations

import argparse
import ast
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import baseline  # noqa: E402
import bench_serving  # noqa: E402
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402

RESULTS = HERE / "results" / "thread_wakes.json"
WARM_S = 2.0  # of the load before the window opens
MIN_SWITCHES = 10  # a thread with fewer in the window is not on the request's path


def _threads(pids: dict[int, str]) -> dict[tuple[int, int], tuple[str, int, int, int]]:
    """(pid, tid) -> (role, voluntary, involuntary switches, ns on a CPU) of every thread of ``pids``."""
    out: dict[tuple[int, int], tuple[str, int, int, int]] = {}
    for pid, process in pids.items():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                name = Path(f"{base}/comm").read_text().strip()
                status = Path(f"{base}/status").read_text()
                ran = int(Path(f"{base}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended between the listing and the reads
            vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            thread = "zmq-io" if name.startswith("ZMQbg/IO") else ("main" if int(tid) == pid else name)
            out[(pid, int(tid))] = (f"{process} {thread}", vol, invol, ran)
    return out


def _per_request(
    before: dict[tuple[int, int], tuple[str, int, int, int]],
    after: dict[tuple[int, int], tuple[str, int, int, int]],
    requests: float,
) -> dict[str, dict[str, float]]:
    """Each role's switches and CPU µs per request over the window (threads of one role summed)."""
    roles: dict[str, dict[str, float]] = {}
    for key, (role, vol, invol, ran) in after.items():
        if key not in before:
            continue
        _, vol0, invol0, ran0 = before[key]
        if (vol - vol0) + (invol - invol0) < MIN_SWITCHES:
            continue
        r = roles.setdefault(role, {"woken": 0.0, "preempted": 0.0, "cpu_us": 0.0})
        r["woken"] += (vol - vol0) / requests
        r["preempted"] += (invol - invol0) / requests
        r["cpu_us"] += (ran - ran0) / 1e3 / requests
    for r in roles.values():
        r["cpu_us_per_wake"] = r["cpu_us"] / r["woken"] if r["woken"] else 0.0
    return {k: {f: round(v, 2) for f, v in roles[k].items()} for k in sorted(roles)}


def _bare_client(endpoint: str, seconds: float, trips: Any, p50: Any) -> None:
    """``baseline.bare_latency_us`` for ``seconds``, counting its trips in ``trips`` as it goes."""
    lats = baseline.bare_latency_us(endpoint, bench_serving.bare_frames(), 10**9, seconds, trips)
    p50.value = statistics.median(lats)


def bare_turn(seconds: float) -> dict[str, Any]:
    """The bare relay: forwarder, echo worker and a client loop, each its own process."""
    with baseline.bare_hop() as endpoint:
        relay = sorted(psutil.Process().children(), key=lambda p: p.create_time())  # forwarder first
        trips, p50 = mp.Value("q", 0, lock=False), mp.Value("d", 0.0, lock=False)
        client = mp.Process(target=_bare_client, args=(endpoint, WARM_S + seconds + 1.0, trips, p50))
        client.start()
        try:
            time.sleep(WARM_S)
            pids = {relay[0].pid: "broker", relay[1].pid: "worker", client.pid or 0: "client"}
            before, n0, t0 = _threads(pids), trips.value, time.monotonic()
            time.sleep(seconds)
            after, n1, window = _threads(pids), trips.value, time.monotonic() - t0
        finally:
            client.join(WARM_S + seconds + 30)
            if client.is_alive():
                client.kill()
    requests = max(1, n1 - n0)
    rate = requests / window
    roles = _per_request(before, after, requests)
    return {"p50_us": round(p50.value, 1), "rate_s": round(rate), "roles": roles}


def zinfer_turn(repo: Path, seconds: float) -> dict[str, Any]:
    """``zinfer serve`` and one sync ``Client`` on ``add0`` in a process of its own."""
    with z.serve(repo) as s:
        code = (
            f"import sys; sys.path.insert(0, {str(HERE)!r}); import zinfer_side as z\n"
            f"s = z.ZinferServer({s.url!r}, {s.pid})\n"
            f"print(z.sync_latency(s, 'add0', {WARM_S + seconds + 1.0}, 10**8))"
        )
        load = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(WARM_S + 0.5)  # sync_latency warms up before its own timed window
            pids = {s.pid: "broker", load.pid: "client"}
            pids.update({c.pid: "worker" for c in psutil.Process(s.pid).children(recursive=True)})
            before, t0 = _threads(pids), time.monotonic()
            time.sleep(seconds)
            after, window = _threads(pids), time.monotonic() - t0
            result = ast.literal_eval(load.communicate(timeout=60)[0].strip())
        finally:
            if load.poll() is None:
                load.kill()
                load.wait(10)
    rate = float(result["throughput_s"])
    roles = _per_request(before, after, rate * window)
    return {"p50_us": result["p50_us"], "rate_s": round(rate), "roles": roles}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="the counted window of each turn")
    ap.add_argument("--label", default="latest")
    args = ap.parse_args()
    turns: dict[str, list[dict[str, Any]]] = {"bare": [], "zinfer": []}
    with tempfile.TemporaryDirectory(prefix="zwk-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "repo", zinfer_only=True)
        for r in range(args.rounds):
            for level in ("bare", "zinfer") if r % 2 == 0 else ("zinfer", "bare"):
                turn = bare_turn(args.seconds) if level == "bare" else zinfer_turn(repo, args.seconds)
                turns[level].append(turn)
                print(f"round {r} {level}: p50 {turn['p50_us']} us, {turn['rate_s']}/s", flush=True)
    medians: dict[str, dict[str, Any]] = {}
    for level, runs in turns.items():
        roles = sorted({role for t in runs for role in t["roles"]})
        medians[level] = {
            "p50_us": statistics.median(t["p50_us"] for t in runs),
            "roles": {
                role: {
                    f: round(statistics.median(t["roles"][role][f] for t in runs if role in t["roles"]), 2)
                    for f in ("woken", "preempted", "cpu_us", "cpu_us_per_wake")
                }
                for role in roles
            },
        }
    print(f"medians of {args.rounds} rounds, per request")
    print(f"{'level':7} {'thread':16} {'woken':>6} {'preempted':>9} {'cpu us':>7} {'us/wake':>8}")
    for level, m in medians.items():
        for role, f in m["roles"].items():
            row = f"{f['woken']:6.2f} {f['preempted']:9.2f} {f['cpu_us']:7.1f} {f['cpu_us_per_wake']:8.1f}"
            print(f"{level:7} {role:16} {row}")
        print(f"{level:7} p50 {m['p50_us']} us")
    command = "bench/thread_wakes.py " + " ".join(sys.argv[1:])
    entry = {"params": vars(args), "medians": medians, "turns": turns}
    bench_serving.record_run(RESULTS, args.label, command, entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
