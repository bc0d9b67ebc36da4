"""What the transport alone costs: zinfer's shape (client -> broker -> worker -> broker -> client) with no
work, over ZeroMQ (as zinfer) and over plain Unix SOCK_SEQPACKET sockets, measured in one run.

Every ZeroMQ ipc message passes through the sending and the receiving context's I/O thread, so one hop
wakes up to four threads; a SEQPACKET datagram goes from one process's send straight to the other's
``epoll``. On a machine where waking a thread is dear (a small VM), this is the difference the broker's
architecture pays per hop. Both relays are Python processes doing the same routing (a client id in front
of each message); both are measured for round-trip p50 with one message in flight, the pipelined rate with
64 in flight, and the CPU seconds of all three processes per round trip.

Usage: ``.venv/bin/python bench/bench_transport.py [--quick]``. Results: bench/results/bench_transport.json.
Every process started here is stopped by its pid; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from bench_serving import ROOT, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "bench_transport.json"
MESSAGE = msgpack.packb({"model": "add", "id": 12345, "inputs": [["INPUT_A", "FP32", [1, 1], 0, 4]]})
IDLE_S = 10.0
MAX = 65536


def _seq_forwarder(front_path: str, back_path: str) -> None:
    front = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    front.bind(front_path)
    front.listen(8)
    back = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    back.bind(back_path)
    back.listen(1)
    worker, _ = back.accept()
    worker.setblocking(False)
    ep = select.epoll()
    ep.register(front.fileno(), select.EPOLLIN)
    ep.register(worker.fileno(), select.EPOLLIN)
    clients: dict[int, socket.socket] = {}
    while True:
        events = ep.poll(IDLE_S)
        if not events:
            return
        for fd, _ in events:
            if fd == front.fileno():
                c, _ = front.accept()
                c.setblocking(False)
                clients[c.fileno()] = c
                ep.register(c.fileno(), select.EPOLLIN)
            elif fd == worker.fileno():
                while True:
                    try:
                        data = worker.recv(MAX)
                    except BlockingIOError:
                        break
                    if not data:
                        return
                    target = clients.get(int.from_bytes(data[:4], "little"))
                    if target is not None:
                        target.send(data[4:])
            else:
                c = clients[fd]
                while True:
                    try:
                        data = c.recv(MAX)
                    except BlockingIOError:
                        break
                    if not data:
                        ep.unregister(fd)
                        del clients[fd]
                        c.close()
                        break
                    worker.send(fd.to_bytes(4, "little") + data)


def _seq_worker(back_path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(back_path)
    sock.settimeout(IDLE_S)
    while True:
        try:
            data = sock.recv(MAX)
        except TimeoutError:
            return
        if not data:
            return
        sock.send(data)


@contextmanager
def seqpacket_hop() -> Iterator[tuple[str, list[int]]]:
    """The SEQPACKET forwarder and echo worker in their own processes; yields the client path and pids."""
    d = tempfile.mkdtemp(prefix="zt-")
    front, back = f"{d}/front", f"{d}/back"
    procs = [mp.Process(target=_seq_forwarder, args=(front, back), daemon=True)]
    procs[0].start()
    deadline = time.monotonic() + 10
    while not os.path.exists(back) and time.monotonic() < deadline:
        time.sleep(0.01)
    procs.append(mp.Process(target=_seq_worker, args=(back,), daemon=True))
    procs[1].start()
    while not os.path.exists(front) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield front, [p.pid for p in procs if p.pid is not None]
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
        for path in (front, back):
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(d)


def seq_latency_us(path: str, n: int) -> list[float]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        s.settimeout(5.0)
        out = []
        for _ in range(n + 50):
            t0 = time.perf_counter()
            s.send(MESSAGE)
            s.recv(MAX)
            out.append((time.perf_counter() - t0) * 1e6)
        return out[50:]


def seq_rate(path: str, n: int, window: int) -> float:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        s.setblocking(False)
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLIN)
        sent = received = 0
        t0 = time.perf_counter()
        while received < n:
            while sent < n and sent - received < window:
                s.send(MESSAGE)
                sent += 1
            if not ep.poll(5.0):
                raise TimeoutError("pipelined run timed out")
            while True:
                try:
                    s.recv(MAX)
                    received += 1
                except BlockingIOError:
                    break
        ep.close()
        return n / (time.perf_counter() - t0)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def measured(pids: list[int], run: Callable[[], Any], count: int) -> tuple[Any, float]:
    """``run()``'s result and the CPU microseconds per round trip of ``pids`` and this process."""
    everyone = [*pids, os.getpid()]
    before = _cpu(everyone)
    result = run()
    return result, (_cpu(everyone) - before) * 1e6 / count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages")
    args = ap.parse_args()
    n_lat, n_rate = (500, 5000) if args.quick else (3000, 30000)
    rows: dict[str, dict[str, float]] = {}
    with baseline.bare_hop() as endpoint:
        time.sleep(0.3)
        pids = [c.pid for c in psutil.Process().children()]
        lat, cpu_lat = measured(
            pids, lambda: baseline.bare_latency_us(endpoint, [MESSAGE], n_lat), n_lat + 50
        )
        rate, cpu_rate = measured(pids, lambda: baseline.bare_rate(endpoint, [MESSAGE], n_rate, 64), n_rate)
        rows["zeromq"] = _row(lat, cpu_lat, rate, cpu_rate)
    with seqpacket_hop() as (path, pids):
        lat, cpu_lat = measured(pids, lambda: seq_latency_us(path, n_lat), n_lat + 50)
        rate, cpu_rate = measured(pids, lambda: seq_rate(path, n_rate, 64), n_rate)
        rows["seqpacket"] = _row(lat, cpu_lat, rate, cpu_rate)
    z, s = rows["zeromq"], rows["seqpacket"]
    ratios = {k: round(s[k] / z[k], 3) for k in z}
    print(f"{'':10s} {'p50 us':>8s} {'CPU us/rt c1':>13s} {'msg/s @64':>10s} {'CPU us/rt @64':>14s}")
    for name, r in rows.items():
        cells = f"{r['p50_us']:8.0f} {r['cpu_us_c1']:13.0f} {r['rate_s']:10.0f} {r['cpu_us_pipelined']:14.0f}"
        print(f"{name:10s} {cells}")
    print(
        f"{'ratio':10s} " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + "  (seqpacket / zeromq)"
    )
    result = {"machine": machine(), "params": {"latency_n": n_lat, "rate_n": n_rate, "window": 64},
              "rows": rows, "seqpacket_over_zeromq": ratios}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {RESULTS.relative_to(ROOT)}")
    return 0


def _row(lat: list[float], cpu_lat: float, rate: float, cpu_rate: float) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "p50_us": round(lat[len(lat) // 2], 1),
        "p99_us": round(lat[int(len(lat) * 0.99)], 1),
        "cpu_us_c1": round(cpu_lat, 1),
        "rate_s": round(rate, 1),
        "cpu_us_pipelined": round(cpu_rate, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
