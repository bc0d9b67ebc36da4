"""Where an HTTP request's time goes inside zinfer at c32, from its own traces: the door's receive, the hop to
the broker, the broker's queue, the worker's round trip, the reply's way back and the door's write.

``zinfer serve --http`` runs on ``vs_triton_repo``'s repository with Triton-style traces on
(``--trace-config level=TIMESTAMPS rate=N``, a JSON file); perf_analyzer (tritonclient 2.51's) drives ``add``
over HTTP at concurrency 32 for one fixed window; the server is stopped (it writes the file) and every
complete trace is split at its timestamps (CLOCK_MONOTONIC, one clock for door and broker):

* ``http recv``: HTTP_RECV_START -> HTTP_RECV_END (the door parsing the request);
* ``door->broker``: HTTP_RECV_END -> REQUEST_START (the door sending it, the hop, the broker picking it up);
* ``admit``: REQUEST_START -> QUEUE_START; ``queue``: QUEUE_START -> the batch's dispatch;
* ``worker round trip``: the batch's dispatch -> its RESULT at the broker (the hop both ways, the worker's
  wake-up and the whole batch's work);
* ``reply``: RESULT -> REQUEST_END (the reply sent); ``broker->door write``: REQUEST_END -> HTTP_SEND_START
  (the hop back, the door picking the reply up and answering); ``http send``: HTTP_SEND_START ->
  HTTP_SEND_END.

Beside them: the machine's idle share over the window and perf_analyzer's own row (throughput, p50, its
``Network+Server Send/Recv`` and the server's queue and compute). Traced requests are one in ``--rate``.

Usage: ``.venv/bin/python bench/door_trace_parts.py --triton-venv DIR [--rate 50] [--interval-ms 3000]
[--label L]`` (``PYTHONPATH=TREE`` for another zinfer tree, e.g. a compiled build). Results:
bench/results/door_trace_parts.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import _free_port  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402
from pa_latency_parts import _machine_ticks, _pa  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "door_trace_parts.json"
SEGMENTS = (
    ("http recv", "HTTP_RECV_START", "HTTP_RECV_END"),
    ("door->broker", "HTTP_RECV_END", "REQUEST_START"),
    ("admit", "REQUEST_START", "QUEUE_START"),
    ("queue", "QUEUE_START", "dispatch"),
    ("worker round trip", "dispatch", "result"),
    ("reply", "result", "REQUEST_END"),
    ("broker->door write", "REQUEST_END", "HTTP_SEND_START"),
    ("http send", "HTTP_SEND_START", "HTTP_SEND_END"),
    ("total in zinfer", "HTTP_RECV_START", "HTTP_SEND_END"),
)


def _serve(repo: Path, tmp: Path, http: str, trace: Path, rate: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repo),
        "--runtime-dir", str(tmp / "rt"), "--metrics", "127.0.0.1:0", "--http", http,
        "--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", f"rate={rate}",
    ]  # fmt: skip
    with open(tmp / "serve.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://{http}/v2/models/add/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            _stop(proc)
            raise RuntimeError(f"zinfer did not get ready:\n{(tmp / 'serve.log').read_text()[-2000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def split(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, means and p90s in µs of each segment over the complete traces of a Triton-format file."""
    by: dict[int, dict[str, int]] = {}
    sizes: list[int] = []
    for e in entries:
        d = by.setdefault(e["id"], {})
        for t in e.get("timestamps", ()):
            d[t["name"]] = t["ns"]
        z = e.get("zinfer")
        if z:
            d["dispatch"], d["result"] = z["dispatch_ns"], z["result_ns"]
            sizes.append(z["batch_size"])
    need = {k for _, a, b in SEGMENTS for k in (a, b)}
    full = [d for d in by.values() if need <= d.keys()]
    out: dict[str, Any] = {"traces": len(by), "complete": len(full)}
    if sizes:
        out["mean_batch"] = round(statistics.mean(sizes), 1)
        # each traced request saw its batch's size: the share of requests by the size of their batch
        counts = collections.Counter(sizes)
        out["requests_by_batch_size"] = {
            str(k): round(v / len(sizes), 3) for k, v in sorted(counts.items()) if v / len(sizes) >= 0.01
        }
    for name, a, b in SEGMENTS:
        v = sorted((d[b] - d[a]) / 1000 for d in full)
        if v:
            out[name] = {"median_us": round(statistics.median(v), 1), "mean_us": round(statistics.mean(v), 1),
                         "p90_us": round(v[int(0.9 * (len(v) - 1))], 1)}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="pytriton 0.7.0, tritonclient 2.51")
    ap.add_argument("--rate", type=int, default=50, help="trace one request in this many")
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--label", default="latest")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv) or triton_side.TritonInstall(
        args.triton_venv, args.triton_venv / "bin" / "python", Path()
    )
    pa = args.triton_venv / "bin" / "perf_analyzer"
    tmp = Path(tempfile.mkdtemp(prefix="zdtp-"))
    try:
        (tmp / "env").mkdir()
        env = triton_side._environment(install, tmp / "env")
        repo = vs_triton_repo.write(tmp / "models", zinfer_only=True)
        http, trace = f"127.0.0.1:{_free_port()}", tmp / "trace.json"
        proc = _serve(repo, tmp, http, trace, args.rate)
        try:
            t0, i0 = _machine_ticks()
            fig = _pa(pa, env, http, args.interval_ms, tmp)
            t1, i1 = _machine_ticks()
        finally:
            _stop(proc)
        parts = split(json.loads(trace.read_text()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    idle = round(100 * (i1 - i0) / max(1, t1 - t0), 1)
    print(f"perf_analyzer {json.dumps(fig)}; idle {idle}%")
    print(f"traces {parts['traces']}, complete {parts['complete']}, mean batch {parts.get('mean_batch')}")
    print(f"requests by batch size: {parts.get('requests_by_batch_size')}")
    for name, _, _ in SEGMENTS:
        if name in parts:
            med, mean, p90 = parts[name]["median_us"], parts[name]["mean_us"], parts[name]["p90_us"]
            print(f"  {name:20} median {med:8.1f} us  mean {mean:8.1f}  p90 {p90:8.1f}")
    command = (f"bench/door_trace_parts.py --triton-venv DIR --rate {args.rate} "
               f"--interval-ms {args.interval_ms} --label {args.label}")  # fmt: skip
    record_run(RESULTS, args.label, command, {"perf_analyzer": fig, "idle_pct": idle, "parts": parts})
    return 0


if __name__ == "__main__":
    sys.exit(main())
