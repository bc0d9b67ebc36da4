"""What per-request tracing costs: on the serving path against the code without this branch, and the
broker's own work per traced request, beside the bare round trip, in one run.

Serving path: four ``zinfer serve`` processes at once on the bundled ``add`` model, one request in flight
each, measured in interleaved rounds (the order turns each round, so drift on a shared machine falls on
every configuration alike):

- ``base``: the code of ``--base`` (a directory whose ``zinfer/`` holds the base commit's packages, put
  first on ``PYTHONPATH`` for the server and its workers), tracing off;
- ``off``: this code, tracing off (Triton's default ``level=OFF``);
- ``on``: this code, every request traced (``level=TIMESTAMPS rate=1``, Triton's JSON file written every
  1000 traces);
- ``tensors``: as ``on`` with ``level=TENSORS`` too (each request's 2 inputs and 1 output written out).

The client is this code's in every case (the same SDK, so only the server differs). ``bare`` is a bare
ZeroMQ round trip through one ROUTER hop with the frames of the same request (``baseline.bare_hop``),
measured in the same rounds. Printed: p50 and mean of each, ``off/base`` (tracing off should change
nothing), and ``on - off`` (the cost of a traced request on the serving path, in µs and in bare round
trips). In-process: the broker's tracer calls for one traced request (``start``, ``batch_ran``,
``replying``, ``finish``) and the two checks of ``Tracer.on`` an untraced request meets.

Usage: ``.venv/bin/python bench/bench_tracing.py --base /tmp/trbase [--n 2000] [--rounds 5] [--label L]``
(without ``--base`` the ``base`` column is left out); writes ``bench/results/bench_tracing.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.broker.model_state import InFlight
from zinfer.broker.trace_settings import TraceSettings
from zinfer.broker.tracing import Tracer
from zinfer.client import protocol
from zinfer.client.errors import Status
from zinfer.client.protocol import InferRequest, Reply, TensorRef
from zinfer.client.worker_protocol import RequestResult, WorkerResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
import bench_serving  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "bench_tracing.json"
WARMUP = 300
TRACE_ON = ("level=TIMESTAMPS", "rate=1", "triton,log-frequency=1000")


# ------------------------------------------------------------------------------------ serving path


def _flags(cfg: str, folder: Path) -> tuple[str, ...]:
    trace: tuple[str, ...] = ()
    if cfg in ("on", "tensors"):
        trace = (*TRACE_ON, f"triton,file={folder / cfg}.json")
        if cfg == "tensors":
            trace += ("level=TENSORS",)
    return ("--metrics", "127.0.0.1:0", *[a for f in trace for a in ("--trace-config", f)])


def _env(base: str | None) -> dict[str, str] | None:
    if base is None:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = base + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# Each configuration's client runs in its own process with its server's code (the base server speaks the base
# code's wire protocol, which this tree's client may not), one request in flight, timed inside that process.
CLIENT = """
import json, sys, time
import numpy as np
from zinfer.client import Client
url, n, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
inputs = {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.full((1, 1), 2.0, np.float32)}
with Client(url, timeout=30) as c:
    for _ in range(warmup):
        c.infer("add", inputs)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.infer("add", inputs)
        out.append((time.perf_counter() - t0) * 1e6)
print(json.dumps(out))
"""


def _latencies(url: str, n: int, env: dict[str, str] | None, warmup: int = 0) -> list[float]:
    """``n`` request latencies (µs) of a client process running the code ``env`` puts first."""
    run = subprocess.run([sys.executable, "-c", CLIENT, url, str(n), str(warmup)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    got: list[float] = json.loads(run.stdout)
    return got


def serving(base: str | None, n: int, rounds: int) -> dict[str, Any]:
    cfgs = (["base"] if base else []) + ["off", "on", "tensors"]
    samples: dict[str, list[float]] = {c: [] for c in [*cfgs, "bare"]}
    round_p50: dict[str, list[float]] = {c: [] for c in [*cfgs, "bare"]}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zbt-")))
        urls = {}
        for cfg in cfgs:
            env = _env(base if cfg == "base" else None)
            urls[cfg] = stack.enter_context(bench_serving.zinfer_server(extra=_flags(cfg, folder), env=env))
        envs = {cfg: _env(base if cfg == "base" else None) for cfg in cfgs}
        frames = bench_serving.bare_frames()
        for cfg in cfgs:
            _latencies(urls[cfg], 0, envs[cfg], WARMUP)
        for r in range(rounds):
            order = [*cfgs, "bare"]
            order = order[r % len(order) :] + order[: r % len(order)]
            for cfg in order:
                if cfg == "bare":  # a fresh hop each round: its echo worker leaves after 10 s idle
                    with baseline.bare_hop() as bare:
                        got = baseline.bare_latency_us(bare, frames, n)
                else:
                    got = _latencies(urls[cfg], n, envs[cfg], WARMUP // 10)
                samples[cfg].extend(got)
                round_p50[cfg].append(float(np.percentile(got, 50)))
    out: dict[str, Any] = {}
    for cfg, xs in samples.items():
        a = np.asarray(xs)
        out[cfg] = {"p50_us": float(np.percentile(a, 50)), "mean_us": float(a.mean()),
                    "p99_us": float(np.percentile(a, 99)), "round_p50_us": round_p50[cfg]}  # fmt: skip
    off, bare_p50 = out["off"]["p50_us"], out["bare"]["p50_us"]
    if "base" in out:
        out["off_over_base_p50"] = off / out["base"]["p50_us"]
        out["off_over_base_mean"] = out["off"]["mean_us"] / out["base"]["mean_us"]
        # each round's own ratio: how far the rounds spread is the noise the ratio above carries
        pairs = zip(round_p50["off"], round_p50["base"], strict=True)
        out["off_over_base_round_p50"] = [o / b for o, b in pairs]
    for cfg in ("on", "tensors"):
        cost = out[cfg]["p50_us"] - off
        out[f"{cfg}_cost_us_p50"] = cost
        out[f"{cfg}_cost_us_mean"] = out[cfg]["mean_us"] - out["off"]["mean_us"]
        out[f"{cfg}_cost_in_bare_round_trips"] = cost / bare_p50
    return out


# ------------------------------------------------------------------------------------ in process


class _P:
    """The parts of a queued request the tracer reads."""

    batch_size = 1
    seq = 1
    cancelled = False
    trace: Any = None
    on_done = None


def _broker_us(tracer: Tracer, n: int) -> float:
    """The tracer's calls for one request, as admission and completion make them, per request."""
    frames = [np.ones(1, np.float32).tobytes()] * 2
    req = InferRequest("r", "add", 1, (TensorRef("INPUT_A", "FP32", (1, 1), frame=0),
                                       TensorRef("INPUT_B", "FP32", (1, 1), frame=1)))  # fmt: skip
    p = _P()
    result = WorkerResult(1, (RequestResult(1, outputs=(TensorRef("OUTPUT_SUM", "FP32", (1, 1), frame=0),)),),
                          timings=(1000, 5000, 1000))  # fmt: skip
    out = [protocol.tensor_to_wire(t) for t in result.results[0].outputs]
    reply = Reply("r", Status.OK, body={"model": "add", "version": 1, "outputs": out})
    batch = InFlight(1, b"add-0", None, [p], time.monotonic_ns())  # type: ignore[arg-type, list-item]
    t0 = time.perf_counter()
    for i in range(n):
        if tracer.on:
            p.trace = tracer.start("add", 1, str(i), {}, time.monotonic_ns(), req, frames)
        if tracer.on:
            tracer.batch_ran(batch, result, frames[:1], time.monotonic_ns())
        t = p.trace
        if t is not None:
            tracer.replying(t, reply, frames[:1])
            tracer.finish(t)
            p.trace = None
    return (time.perf_counter() - t0) / n * 1e6


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that answers 200 and keeps nothing."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def in_process(n: int) -> dict[str, float]:
    out = {"off_us": _broker_us(Tracer(TraceSettings()), n * 10)}
    with tempfile.TemporaryDirectory() as d:
        for name, level in (("timestamps_us", ("TIMESTAMPS",)), ("tensors_us", ("TIMESTAMPS", "TENSORS"))):
            tracer = Tracer(TraceSettings(level=level, rate=1, file=f"{d}/t.json", log_frequency=1000))
            out[name] = _broker_us(tracer, n)
            tracer.close()
        every_1000 = TraceSettings(level=("TIMESTAMPS",), rate=1000, file=f"{d}/s.json", log_frequency=1000)
        sampled = Tracer(every_1000)
        out["rate_1000_us"] = _broker_us(sampled, n * 5)
        sampled.close()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    try:
        settings = TraceSettings(level=("TIMESTAMPS",), rate=1, mode="opentelemetry", otel=(("url", url),))
        otel = Tracer(settings)
        out["opentelemetry_us"] = _broker_us(otel, max(1, n // 10))
        otel.close()
    except ImportError:  # without zinfer[tracing]
        pass
    finally:
        sink.shutdown()
        sink.server_close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a directory whose zinfer/ is the base code (put first on PYTHONPATH)")
    ap.add_argument("--n", type=int, default=2000, help="requests per configuration per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.base and not (Path(args.base) / "zinfer" / "broker").is_dir():
        ap.error(f"--base {args.base}: no zinfer/broker there")
    s = serving(args.base, args.n, args.rounds)
    proc = in_process(20_000)
    print(f"serving path, add [1,1] FP32, one request in flight, {args.rounds} rounds x {args.n} requests:")
    for cfg in ("bare", "base", "off", "on", "tensors"):
        if cfg in s:
            r = s[cfg]
            print(f"  {cfg:8s} p50 {r['p50_us']:8.1f} us   mean {r['mean_us']:8.1f} us   "
                  f"p99 {r['p99_us']:8.1f} us")  # fmt: skip
    if "off_over_base_p50" in s:
        spread = ", ".join(f"{x:.3f}" for x in s["off_over_base_round_p50"])
        print(f"  tracing off / base: p50 {s['off_over_base_p50']:.3f}x, mean {s['off_over_base_mean']:.3f}x "
              f"(rounds: {spread})")  # fmt: skip
    for cfg in ("on", "tensors"):
        p50, mean = s[f"{cfg}_cost_us_p50"], s[f"{cfg}_cost_us_mean"]
        trips = s[f"{cfg}_cost_in_bare_round_trips"]
        print(f"  {cfg} - off: {p50:+.1f} us p50 ({mean:+.1f} us mean) per traced request "
              f"= {trips:.2f} bare round trips")  # fmt: skip
    print(f"broker tracer calls in process: off {proc['off_us']:.3f} us, rate=1000 "
          f"{proc['rate_1000_us']:.2f} us, TIMESTAMPS {proc['timestamps_us']:.2f} us, TENSORS "
          f"{proc['tensors_us']:.2f} us, opentelemetry {proc.get('opentelemetry_us', float('nan')):.1f} us "
          "per request")  # fmt: skip
    record = {
        "label": args.label,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": bench_serving.machine(),
        "n": args.n,
        "rounds": args.rounds,
        "serving": s,
        "in_process": proc,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
