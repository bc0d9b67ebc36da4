"""The client SDK's own CPU per request, two zinfer trees in turns in one run, beside a bare round trip.

A stub server (a ROUTER in a process of its own that answers every request at once with a canned ``add``
reply) takes the broker and the workers out of the figure: what is measured is the client process alone,
its CPU time (all its threads: Python's and libzmq's I/O thread) and its main thread's, per request:

* ``sync``: one ``Client``, one request in flight (``add0``'s two [1,1] FP32 inputs, inline);
* ``async``: one ``AsyncClient``, 32 requests in flight;
* ``bare``: a DEALER sending two frames of the same size and receiving the reply: the floor in Python.

Each measurement runs in a fresh process whose ``PYTHONPATH`` selects a tree (a folder holding
``zinfer/{client,...}``, or a compiled build's), A and B alternating for ``--rounds`` rounds; the medians
are printed with B/A. The stub runs tree A's protocol module (the wire is the same).

Usage: ``python bench/ab_client_cpu.py A_PATH B_PATH [--rounds 5] [--requests 4000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

ADD = {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.full((1, 1), 2.0, np.float32)}
_SPEC = [-1, 1]
META = {
    "name": "add0", "versions": ["1"], "platform": "python", "max_batch_size": 8,
    "inputs": [{"name": "INPUT_A", "datatype": "FP32", "shape": _SPEC},
               {"name": "INPUT_B", "datatype": "FP32", "shape": _SPEC}],
    "outputs": [{"name": "OUTPUT_SUM", "datatype": "FP32", "shape": _SPEC}],
}  # fmt: skip
BODY = {"model": "add0", "version": 1,
        "outputs": [{"name": "OUTPUT_SUM", "datatype": "FP32", "shape": [1, 1], "frame": 0}]}  # fmt: skip
OUT = np.float32([3.0]).tobytes()
BARE = b"BARE"
CONCURRENCY = 32


def stub(path: str) -> None:
    from zinfer.client import protocol
    from zinfer.client.protocol import Command

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind("ipc://" + path)
    print("ready", flush=True)
    while True:
        ident, *frames = sock.recv_multipart()
        if frames[0][:4] == BARE:
            sock.send_multipart([ident, *frames])
            continue
        out = []
        for m in protocol.decode_many(frames):
            rid = m.header.get("id", "")
            if m.command == Command.INFER:
                out.append((Command.REPLY, {"id": rid, "status": 0, "body": BODY}, [OUT]))
            else:
                body = META if m.command == Command.MODEL_METADATA else True
                out.append((Command.REPLY, {"id": rid, "status": 0, "body": body}, []))
        reply = protocol.encode(*out[0]) if len(out) == 1 else protocol.encode_bundle(out)
        sock.send_multipart([ident, *reply])


def _clock() -> tuple[float, float, float]:
    return time.process_time(), time.thread_time(), time.perf_counter()


def _per(t0: tuple[float, float, float], n: int) -> dict[str, float]:
    t1 = _clock()
    keys = ("cpu_us", "thread_us", "wall_us")
    return {k: round((b - a) / n * 1e6, 1) for k, a, b in zip(keys, t0, t1, strict=True)}


def run_sync(url: str, n: int) -> dict[str, float]:
    from zinfer.client import Client

    with Client(url, timeout=10) as c:
        for _ in range(200):
            assert c.infer("add0", ADD).as_numpy("OUTPUT_SUM")[0, 0] == 3.0
        t0 = _clock()
        for _ in range(n):
            c.infer("add0", ADD)
        return _per(t0, n)


def run_async(url: str, n: int) -> dict[str, float]:
    from zinfer.client import AsyncClient

    async def go() -> dict[str, float]:
        async with AsyncClient(url, timeout=10) as c:
            for _ in range(100):
                await c.infer("add0", ADD)
            left = n

            async def loop() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await c.infer("add0", ADD)

            t0 = _clock()
            await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
            return _per(t0, n)

    return asyncio.run(go())


def run_bare(url: str, n: int) -> dict[str, float]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    frames = [BARE + b"\x01" + b"x" * 150, b"y" * 24]  # about an add request's envelope and packed inputs
    for _ in range(200):
        sock.send_multipart(frames)
        sock.recv_multipart()
    t0 = _clock()
    for _ in range(n):
        sock.send(frames[0], zmq.SNDMORE)
        sock.send(frames[1])
        frame = sock.recv(copy=False)
        while frame.more:
            frame = sock.recv(copy=False)
    out = _per(t0, n)
    sock.close()
    return out


RUNS = {"sync": run_sync, "async": run_async, "bare": run_bare}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--stub":
        stub(sys.argv[2])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(RUNS[sys.argv[2]](sys.argv[3], int(sys.argv[4]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--modes", default="bare,sync,async")
    args = ap.parse_args()
    modes = args.modes.split(",")
    results: dict[str, dict[str, list[dict[str, float]]]] = {m: {"A": [], "B": []} for m in modes}
    with tempfile.TemporaryDirectory(prefix="zabc-") as tmp:
        os.chmod(tmp, 0o700)
        path = str(Path(tmp) / "stub.sock")
        env_a = {**os.environ, "PYTHONPATH": str(args.a)}
        cmd = [sys.executable, __file__, "--stub", path]
        server = subprocess.Popen(cmd, env=env_a, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
            for _ in range(args.rounds):
                for side, tree in (("A", args.a), ("B", args.b)):
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    for mode in modes:
                        cmd = [sys.executable, __file__, "--one", mode, f"ipc://{path}", str(args.requests)]
                        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
                        if done.returncode != 0:
                            raise SystemExit(done.stderr[-2000:])
                        results[mode][side].append(json.loads(done.stdout))
        finally:
            server.kill()
            server.wait()
    summary: dict[str, Any] = {}
    for mode in modes:
        row: dict[str, Any] = {}
        for key in ("cpu_us", "thread_us", "wall_us"):
            a = statistics.median(r[key] for r in results[mode]["A"])
            b = statistics.median(r[key] for r in results[mode]["B"])
            row[key] = {"A": a, "B": b, "B/A": round(b / a, 3)}
        summary[mode] = row
    print(json.dumps({"rounds": args.rounds, "requests": args.requests, "medians": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
