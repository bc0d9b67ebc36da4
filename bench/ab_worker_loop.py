"""One worker process alone behind a ROUTER this bench holds, for two or more trees in turns in one run: the
worker's CPU per request with its socket, its loop, its model and its RESULT, and nothing of a broker.

The worker is started as the broker starts one (``python -m zinfer.workers``, its tree on ``PYTHONPATH``) on
bench_vs_triton's repository (``vs_triton_repo``); this process plays the broker: it sends EXECUTEs of
``--requests`` requests each (several: a run, ``serial``, as the broker sends a model without dynamic
batching), ``--depth`` of them in flight (1: one at a time, as at concurrency 1; more: the worker never
waits for its next message, as under load), and reads the RESULTs. CPU is the kernel's per-thread counters
of every thread of the worker process (``/proc/PID/task/TID/schedstat``, as ``ab_compiled_ensemble``), over
``--seconds`` after a warm-up; per request, with the round trip's p50 at depth 1, and the least of its
0.25 s windows (on a shared machine other processes only ever add to it: the least is the least disturbed).
Loads: MODEL:REQUESTS:DEPTH (``tokenizer``, ``lm``, ``detokenizer``: the three-step ensemble's Triton-style
steps; ``add0``: the built-in add kernel; ``add``: the Triton-style add; ``bare``: no worker but a DEALER
that answers each message with a RESULT-sized reply of two frames, with the same socket options and calls
(blocking ``recv`` with RCVTIMEO, pyzmq's Cython ``send``): the floor of the socket and its wake-ups).

Usage: ``.venv/bin/python bench/ab_worker_loop.py NAME=TREE NAME=TREE [--loads tokenizer:1:1,add0:1:1]
[--rounds 4] [--seconds 2]`` (a TREE imports as ``zinfer`` on PYTHONPATH: a compiled build's ``path`` of
``ab_compiled_ensemble --keep``, or a symlink tree). Writes ``bench/results/ab_worker_loop.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ab_worker_loop.json"
TEXT = b"The quick brown fox jumps over the lazy dog"
LOADS = "tokenizer:1:1,tokenizer:8:4,lm:1:1,add0:1:1"
WINDOW_S = 0.25
BARE = """
import sys, zmq
from zmq.backend import Socket
from zinfer.client import protocol
from zinfer.client.protocol import Command
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.IDENTITY, b"w0")
s.setsockopt(zmq.LINGER, 2000)
s.setsockopt(zmq.RCVTIMEO, 500)
s.connect(sys.argv[1])
s.send_multipart(protocol.encode(Command.W_READY, {}))
header = {"batch": 1, "results": [{"id": 1, "outputs": []}], "t": [0, 0, 0]}
reply = protocol.encode(Command.W_RESULT, header, [b"y" * 172])
recv, send, more = Socket.recv, Socket.send, int(zmq.SNDMORE)
while True:
    try:
        f = recv(s, 0, False)
    except zmq.Again:
        continue
    first = f.bytes
    while f.more:
        f = recv(s, 0, False)
    if first[4] == Command.W_SHUTDOWN:
        break
    send(s, reply[0], more, True)
    send(s, reply[1], 0, True)
s.close()
ctx.term()
"""


def cpu_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def child(load: str, seconds: float) -> dict[str, Any]:
    """One load on one worker of the tree this process imports (run with that tree on PYTHONPATH)."""
    import numpy as np
    import zmq

    sys.path.insert(0, str(HERE))
    import vs_triton_repo

    from zinfer.client import dtypes, protocol
    from zinfer.client import worker_protocol as wp
    from zinfer.client.protocol import Command, TensorRef

    model, n_requests, depth = load.split(":")
    per, inflight = int(n_requests), int(depth)
    if model == "tokenizer":
        payload = dtypes.serialize_bytes(np.array([[TEXT]], dtype=object))
        tensors: tuple[TensorRef, ...] = (TensorRef("TEXT", "BYTES", (1, 1), None, 0),)
        outputs = ("TOKENS",)
    elif model in ("lm", "detokenizer"):
        payload = np.arange(1, len(TEXT) + 1, dtype=np.int32).reshape(1, -1).tobytes()
        tensors = (TensorRef("TOKENS", "INT32", (1, len(TEXT)), None, 0),)
        outputs = ("TOKENS_OUT",) if model == "lm" else ("TEXT",)
    elif model == "bare":
        payload, tensors, outputs = b"x" * 100, (TensorRef("TEXT", "BYTES", (1, 1), None, 0),), ("T",)
    else:  # add0, add: INPUT_A, INPUT_B of [1, 1] float32
        payload = np.ones((1, 1), dtype=np.float32).tobytes()
        tensors = tuple(TensorRef(f"INPUT_{x}", "FP32", (1, 1), None, 0) for x in "AB")
        outputs = ("OUTPUT_SUM",)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    with tempfile.TemporaryDirectory(prefix="zwl-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "repo", zinfer_only=True)
        endpoint = f"ipc://{tmp}/w.sock"
        sock.bind(endpoint)
        command = ["-c", BARE, endpoint] if model == "bare" else ["-m", "zinfer.workers"]
        worker = subprocess.Popen(
            [sys.executable, *command, "--endpoint", endpoint, "--repository", str(repo),
             "--model", model, "--version", "1", "--instance", "0", "--identity", "w0",
             "--parent", str(os.getpid()), "--log-level", "WARNING", "--heartbeat-interval", "60"],
            cwd="/",
        )  # fmt: skip
        try:
            return _drive(sock, worker.pid, per, inflight, seconds, tensors, outputs, payload, wp, protocol)
        finally:
            sock.send_multipart([b"w0", *protocol.encode(Command.W_SHUTDOWN, {})])
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            sock.close(0)
            ctx.term()


def _recv(sock: Any, protocol: Any, timeout_s: float = 60.0) -> Any:
    """The next message from the worker itself (heartbeats are skipped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(1000):
            who, *frames = sock.recv_multipart(copy=False)
            if who.bytes == b"w0":
                return protocol.decode([f.buffer for f in frames])
    raise SystemExit("the worker did not answer")


def _drive(sock: Any, pid: int, per: int, inflight: int, seconds: float, tensors: Any, outputs: Any,
           payload: bytes, wp: Any, protocol: Any) -> dict[str, Any]:  # fmt: skip
    from msgspec.structs import replace

    from zinfer.client.protocol import Command, OutputRequest

    msg = _recv(sock, protocol)
    if msg.command != Command.W_READY:
        raise SystemExit(f"the worker said {msg.command.name}, not READY")
    batch = [0]
    outs = tuple(OutputRequest(o) for o in outputs)

    def send() -> None:
        batch[0] += 1
        n = len(tensors)
        reqs = tuple(
            wp.ExecuteRequest(
                batch[0] * 100 + i, tuple(replace(t, frame=i * n + k) for k, t in enumerate(tensors)), outs
            )
            for i in range(per)
        )
        header = wp.execute_to_wire(wp.Execute(batch[0], reqs, serial=per > 1))
        frames = [payload] * (per * len(tensors))
        sock.send_multipart([b"w0", *protocol.encode(Command.W_EXECUTE, header, frames)])

    def result() -> Any:
        got = _recv(sock, protocol)
        if got.command != Command.W_RESULT:
            raise SystemExit(f"the worker said {got.command.name}, not RESULT")
        return got

    send()
    first = wp.result_from_wire(result().header)
    failed = [r for r in first.results if r.status != 0]
    if failed or len(first.results) != per:
        raise SystemExit(f"the worker failed the requests: {failed or first}")

    for _ in range(200):  # warm up
        send()
        result()
    latencies: list[float] = []
    done = 0
    windows: list[float] = []  # CPU per request of each WINDOW_S: the least is the one others disturbed least
    for _ in range(inflight):
        send()
    c0, t0 = cpu_ns(pid), time.monotonic()
    cw, tw, dw = c0, t0, 0
    while time.monotonic() - t0 < seconds:
        s = time.perf_counter()
        result()
        latencies.append(time.perf_counter() - s)
        done += 1
        send()
        if time.monotonic() - tw >= WINDOW_S:
            c = cpu_ns(pid)
            windows.append((c - cw) / 1e3 / ((done - dw) * per))
            cw, tw, dw = c, time.monotonic(), done
    c1, t1 = cpu_ns(pid), time.monotonic()
    for _ in range(inflight):
        result()
    requests = done * per
    return {
        "worker_us": round((c1 - c0) / 1e3 / requests, 1),
        "best_window_us": round(min(windows), 1) if windows else None,
        "p50_us": round(statistics.median(latencies) * 1e6, 1) if inflight == 1 else None,
        "rate_s": round(requests / (t1 - t0), 1),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], float(sys.argv[3]))))
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("trees", nargs="+", metavar="NAME=TREE")
    ap.add_argument("--loads", default=LOADS)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    trees = {n: Path(t).resolve() for n, t in (x.split("=", 1) for x in args.trees)}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        load: {n: [] for n in trees} for load in args.loads.split(",")
    }
    for load in runs:
        for i in range(args.rounds):
            for name, tree in trees.items():
                env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tree)}
                done = subprocess.run([sys.executable, __file__, "--child", load, str(args.seconds)], env=env,
                                      capture_output=True, text=True, timeout=300, cwd="/")  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"{name} {load} failed:\n{done.stderr[-3000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                runs[load][name].append(r)
                print(f"{load:>16} round {i + 1} {name:>6}: {r}", flush=True)
    print("medians (worker CPU us per request; B/A: median of the rounds' ratios to the first tree):")
    first = next(iter(trees))
    summary: dict[str, dict[str, Any]] = {}
    for load, by_tree in runs.items():
        for name, rs in by_tree.items():
            ratio = statistics.median(
                b["worker_us"] / a["worker_us"] for a, b in zip(by_tree[first], rs, strict=True)
            )
            m = {
                "worker_us": statistics.median(r["worker_us"] for r in rs),
                "best_window_us": min(r["best_window_us"] for r in rs),
                "rate_s": statistics.median(r["rate_s"] for r in rs),
                "ratio": round(ratio, 3),
            }
            if rs[0]["p50_us"] is not None:
                m["p50_us"] = statistics.median(r["p50_us"] for r in rs)
            summary.setdefault(load, {})[name] = m
            print(f"  {load:>16} {name:>6}: {m}")
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "trees": list(trees), "loads": list(runs), "rounds": args.rounds,
           "seconds": args.seconds, "summary": summary, "runs": runs}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
