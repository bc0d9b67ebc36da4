"""What per-message code costs as the first thing a process does after a wake-up, beside the same code warm:
the reason zinfer's c1 round trip is 1.3x the bare relay's when its per-message work, timed warm, is a few
microseconds.

The floor relay's processes (``floor_procs``, level ``numpy``: zinfer's records, encoders and array work on
the bare relay's sockets) run at concurrency 1, with a worker of this module's that times its steps:
decoding the EXECUTE, the array work, encoding the RESULT, and the send; then decodes the same EXECUTE a
second time at once. The client (this process) times its encode of each INFER and its read of each REPLY.
Beside them, each step is timed warm: the same call on the same message 20,000 times in a loop (``timeit``).

Per step: warm, first after the wake-up, and (the worker's decode) again right after, in us; the ratio of
after-wake to warm. On a machine where a process's caches are cold after every sleep, the first column is
what a microbenchmark sees and the second what a request pays.

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/wake_cost.py [--seconds 4] [--label L]`` (a build
of ``bench_compiled.build_compiled``; without one, the interpreted modules). Results:
bench/results/wake_cost.json (an entry per label).
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
import timeit
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import floor_procs as fp  # noqa: E402
import zmq  # noqa: E402
from bench_serving import record_run  # noqa: E402

from zinfer.broker.compiled import compiled_here  # noqa: E402
from zinfer.client import protocol  # noqa: E402
from zinfer.client.protocol import Command, TensorRef  # noqa: E402
from zinfer.client.worker_protocol import decode_execute, encode_execute  # noqa: E402
from zinfer.client.worker_records import Execute, ExecuteRequest, RequestResult, WorkerResult  # noqa: E402

RESULTS = HERE / "results" / "wake_cost.json"
WARM_N = 20_000
STEPS = ("worker decode", "worker arrays", "worker encode", "client encode", "client read")


def _sum(ex: Execute, frames: list[Any]) -> list[Any]:
    """The worker's array work (as ``floor_procs.worker``): the two inputs as arrays, their sum's bytes."""
    r = ex.requests[0]
    return [(fp._array(r.inputs[0], frames) + fp._array(r.inputs[1], frames)).tobytes()]


def _result(ex: Execute, out: list[Any]) -> list[Any]:
    """The RESULT's frames: its records built and encoded (as ``floor_procs.worker``)."""
    results = tuple(
        RequestResult(r.id, outputs=(TensorRef(r.outputs[0].name, "FP32", (1, 1), None, i),))
        for i, r in enumerate(ex.requests)
    )
    return protocol.encode(Command.W_RESULT, WorkerResult(ex.batch, results, timings=(1, 2, 3)), out)


def timed_worker(back_ep: str, out_path: str) -> None:
    """The floor worker with each step timed; writes its per-step times (ns) to ``out_path`` on exit."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(back_ep)
    sock.send(b"hello")
    ns = time.perf_counter_ns
    times: dict[str, list[int]] = {"worker decode": [], "worker decode again": [], "worker arrays": [],
                                   "worker encode": [], "worker send": []}  # fmt: skip
    while sock.poll(3000):
        msg = sock.recv_multipart()
        t0 = ns()
        got = decode_execute(msg)
        t1 = ns()
        decode_execute(msg)
        t2 = ns()
        assert got is not None
        out = _sum(got.record, got.frames)
        t3 = ns()
        frames = _result(got.record, out)
        t4 = ns()
        sock.send_multipart(frames)
        t5 = ns()
        times["worker decode"].append(t1 - t0)
        times["worker decode again"].append(t2 - t1)
        times["worker arrays"].append(t3 - t2)
        times["worker encode"].append(t4 - t3)
        times["worker send"].append(t5 - t4)
    Path(out_path).write_text(json.dumps(times))
    sock.close(linger=0)
    ctx.term()


def _warm(fn: Any) -> float:
    return timeit.timeit(fn, number=WARM_N) / WARM_N * 1e6


def warm_costs() -> dict[str, float]:
    """Each step in a tight loop on one message: what a microbenchmark sees."""
    fc = fp.FloorClient(arrays=True)
    infer = [bytes(f) for f in fc.request()[1]]
    got = protocol.decode_infer(infer)
    assert got is not None
    req = got.record
    execute = encode_execute(
        Execute(7, (ExecuteRequest(0, req.inputs, req.outputs, req.caller_id),)), got.frames
    )
    execute = [bytes(f) for f in execute]
    decoded = decode_execute(execute)
    assert decoded is not None
    ex, frames = decoded.record, decoded.frames
    out = _sum(ex, frames)
    body = {"model": fp.MODEL, "version": 1, "outputs": [TensorRef("OUTPUT_SUM", "FP32", (1, 1), None, 0)]}

    def reply() -> Any:
        rid, _ = fc.request()  # an id the client waits for, as a reply to it must name
        frames = [
            bytes(f) for f in protocol.encode(Command.REPLY, {"id": rid, "status": 0, "body": body}, out)
        ]
        return frames

    replies = [reply() for _ in range(WARM_N)]
    it = iter(replies)
    costs = {
        "worker decode": _warm(lambda: decode_execute(execute)),
        "worker arrays": _warm(lambda: _sum(ex, frames)),
        "worker encode": _warm(lambda: _result(ex, out)),
        "client encode": _warm(fc.request),
        "client read": _warm(lambda: fc.reply(next(it))),
    }  # fmt: skip
    return costs


def relay_costs(seconds: float) -> tuple[dict[str, list[int]], float, int]:
    """The floor broker, the timed worker and this process's client loop at c1: per-step times (ns) of each
    request, the p50 round trip (us) and the request count."""
    with tempfile.TemporaryDirectory(prefix="zwc-") as d:
        front, back, out = f"ipc://{d}/front", f"ipc://{d}/back", f"{d}/worker.json"
        run = [sys.executable, "-c", "import floor_procs; floor_procs.main()"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        broker = subprocess.Popen([*run, "broker", "numpy", front, back], env=env)
        code = "import sys, wake_cost; wake_cost.timed_worker(*sys.argv[1:])"
        worker = subprocess.Popen([sys.executable, "-c", code, back, out], env=env)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(front)
        fc = fp.FloorClient(arrays=True)
        ns = time.perf_counter_ns
        times: dict[str, list[int]] = {"client encode": [], "client read": []}
        lats: list[int] = []
        try:
            for i in range(200 + 10**7):
                t0 = ns()
                _, frames = fc.request()
                t1 = ns()
                sock.send_multipart(frames)
                if not sock.poll(10_000):
                    raise RuntimeError("no reply within 10 s")
                msg = sock.recv_multipart()
                t2 = ns()
                fc.reply(msg)
                t3 = ns()
                if i == 200:
                    end = time.monotonic() + seconds
                if i >= 200:
                    times["client encode"].append(t1 - t0)
                    times["client read"].append(t3 - t2)
                    lats.append(t3 - t0)
                    if time.monotonic() > end:
                        break
            sock.close(linger=0)
            ctx.term()
            worker.wait(timeout=30)
            times.update(json.loads(Path(out).read_text()))
        finally:
            for p in (worker, broker):
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=10)
    return times, statistics.median(lats) / 1e3, len(lats)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--label", default="latest")
    args = ap.parse_args()
    warm = warm_costs()
    times, p50, n = relay_costs(args.seconds)
    rows: dict[str, dict[str, float]] = {}
    for step in STEPS:
        woke = statistics.median(times[step]) / 1e3
        rows[step] = {"warm_us": round(warm[step], 2), "after_wake_us": round(woke, 2),
                      "ratio": round(woke / warm[step], 2)}  # fmt: skip
    rows["worker decode"]["again_us"] = round(statistics.median(times["worker decode again"]) / 1e3, 2)
    send = round(statistics.median(times["worker send"]) / 1e3, 2)  # the send itself: no warm twin
    mode = "compiled" if compiled_here() else "interpreted"
    print(f"floor relay (numpy level) at c1, {mode}: {n} requests, p50 {p50:.1f} us; medians per request:")
    print(f"  {'step':16s} {'warm':>8s} {'after wake':>11s} {'ratio':>6s}")
    for step, r in rows.items():
        again = f"   (again at once: {r['again_us']:.2f} us)" if "again_us" in r else ""
        print(f"  {step:16s} {r['warm_us']:8.2f} {r['after_wake_us']:11.2f} {r['ratio']:6.2f}{again}")
    print(f"  worker send (ZeroMQ's send of the RESULT, for scale): {send:.2f} us")
    entry = {"modules": mode, "requests": n, "p50_us": round(p50, 1), "steps": rows, "worker_send_us": send}
    record_run(
        RESULTS, args.label, f"bench/wake_cost.py --seconds {args.seconds:g} --label {args.label}", entry
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
