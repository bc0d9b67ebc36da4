"""Serving benchmark: a real ``zinfer serve`` beside the raw limits of the same machine, in one run.

(a) latency of ``add`` at concurrency 1 vs a bare ZeroMQ round trip through one ROUTER hop;
(b) throughput of ``add`` at concurrency 1/8/32/64 (one Client per thread) vs the bare pipelined rate;
(c) a 16 MiB and a 4 MiB tensor through ``identity``, copied and zero-copy, vs memcpy into shared memory;
(d) registering one arena segment (hand-off of its descriptor + REGISTER) vs the bare round trip.

Usage: ``.venv/bin/python bench/bench_serving.py [--quick] [--big-only]`` (``--big-only``: (c) and (d) only,
more repetitions). Results go to bench/results/bench_serving.json (bench_serving_big.json for --big-only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.paths import client_endpoint
from zinfer.client.protocol import Command, InferRequest, OutputRequest, TensorRef
from zinfer.client.shm import Segment

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "bench_serving.json"
BIG_SHAPE = (1, 4 << 20)  # 16 MiB of fp32
MID_SHAPE = (1, 1 << 20)  # 4 MiB of fp32
SIZES = {"16MiB": BIG_SHAPE, "4MiB": MID_SHAPE}
FORMS = ("copied", "zero_copy")
BIG_ONLY = {"lat_n": 2000, "big_n": 60, "reg_n": 200}
FULL = {"warmup": 1000, "lat_n": 5000, "step_s": 5.0, "step_max": 200_000, "rate_n": 50_000, "big_n": 30}
QUICK = {"warmup": 500, "lat_n": 500, "step_s": 1.0, "step_max": 20_000, "rate_n": 5_000, "big_n": 15}
CONCURRENCY = (1, 8, 32, 64)
TIMEOUT_S = 30.0  # every request's receive timeout
LOAD_PROCESSES = 4  # load-generating processes for the throughput steps
LOOP_MAX_S = 120.0  # a measurement loop stops here even if its count is not reached


# ---------------------------------------------------------------------------------------------- server


@contextmanager
def zinfer_server(
    ready_timeout_s: float = 60.0,
    extra: tuple[str, ...] = (),
    repository: Path = ROOT / "configs/models",
    env: dict[str, str] | None = None,
    all_loaded: bool = False,
) -> Iterator[str]:
    """A ``zinfer serve`` on ``repository`` (default: the bundled models) in a temp runtime dir; yields its
    URL; always stopped. ``extra`` adds serve options (default: metrics on any free port); ``all_loaded``
    fails when a model did not load."""
    tmp = Path(tempfile.mkdtemp(prefix="zbs-", dir="/tmp"))
    log_path = tmp / "serve.log"
    cmd = [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repository)]
    cmd += ["--runtime-dir", str(tmp / "rt"), *(extra or ("--metrics", "127.0.0.1:0"))]
    proc = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        _wait_ready(proc, log_path, ready_timeout_s, all_loaded)
        yield client_endpoint(tmp / "rt")
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(
    proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float, all_loaded: bool = False
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if "event=ready" in text:
            if all_loaded and "failed=-" not in text:
                raise RuntimeError(f"zinfer serve: a model failed to load:\n{text[-2000:]}")
            return
        if proc.poll() is not None:
            raise RuntimeError(f"zinfer serve exited with {proc.returncode}:\n{text[-2000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"zinfer serve not ready within {timeout_s} s:\n{log_path.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and its workers
        proc.wait(5)


# ---------------------------------------------------------------------------------------------- helpers


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def model_stats(client: Client, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.statistics(model)["model_stats"][0]
    return stats


def mean_batch(before: dict[str, Any], after: dict[str, Any]) -> float:
    was = {b["batch_size"]: b["count"] for b in before["batch_stats"]}
    diff = {b["batch_size"]: b["count"] - was.get(b["batch_size"], 0) for b in after["batch_stats"]}
    execs = sum(diff.values())
    return sum(size * n for size, n in diff.items()) / execs if execs else 0.0


def timing_ns(before: dict[str, Any], after: dict[str, Any], key: str) -> float:
    """Mean ns per execution of one ``inference_stats`` field between two snapshots."""
    b, a = before["inference_stats"][key], after["inference_stats"][key]
    count = a["count"] - b["count"]
    return (a["ns"] - b["ns"]) / count if count else 0.0


def add_inputs() -> dict[str, np.ndarray]:
    return {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.full((1, 1), 2.0, np.float32)}


def bare_frames() -> list[bytes]:
    """The frames a real ``add`` request is made of: 2 inputs of shape [1,1], which the client sends inline
    (tensors of 4 KiB or less travel inline), and the output requested without a slot."""
    inputs = tuple(TensorRef(n, "FP32", (1, 1), frame=i) for i, n in enumerate(("INPUT_A", "INPUT_B")))
    req = InferRequest(
        request_id=f"{os.getpid()}-{id(inputs):x}-1000",
        model="add",
        version=0,
        inputs=inputs,
        outputs=(OutputRequest("OUTPUT_SUM"),),
    )
    payload = [np.ones(1, np.float32).tobytes()] * 2
    return [bytes(f) for f in protocol.encode(Command.INFER, protocol.infer_to_wire(req), payload)]


# ------------------------------------------------------------------------------------------ (a) latency


def zinfer_latency_us(url: str, warmup: int, n: int) -> list[float]:
    inputs = add_inputs()
    out = []
    deadline = time.perf_counter() + LOOP_MAX_S
    with Client(url, timeout=TIMEOUT_S) as c:
        for i in range(warmup + n):
            if time.perf_counter() > deadline:
                break
            t0 = time.perf_counter()
            c.infer("add", inputs)
            if i >= warmup:
                out.append((time.perf_counter() - t0) * 1e6)
    return out


# ------------------------------------------------------------------------------------------ (b) throughput


def _closed_loop(c: Client, clock: tuple[float, float], cap: int, out: list[Any]) -> None:
    inputs = add_inputs()
    done = 0
    try:
        c.infer("add", inputs)  # fetch metadata: not counted
        time.sleep(max(0.0, clock[0] - time.time()))
        while done < cap and time.time() < clock[1]:
            c.infer("add", inputs)
            done += 1
        out.append(done)
    except BaseException as exc:  # reported by the main thread
        out.append(exc)


def _load_process(url: str, threads: int, clock: tuple[float, float], cap: int, results: Any) -> None:
    """One load-generating process: ``threads`` closed loops, each with its own Client."""
    clients = [Client(url, timeout=TIMEOUT_S) for _ in range(threads)]
    out: list[Any] = []
    try:
        ts = [threading.Thread(target=_closed_loop, args=(c, clock, cap, out), daemon=True) for c in clients]
        for t in ts:
            t.start()
        for t in ts:
            t.join(clock[1] - time.time() + TIMEOUT_S)
    finally:
        for c in clients:
            c.close()
    errors = [repr(e) for e in out if isinstance(e, BaseException)]
    results.put((sum(x for x in out if isinstance(x, int)), len(out), errors))


def throughput_step(url: str, conc: int, duration_s: float, cap: int) -> dict[str, float]:
    """``conc`` closed loops spread over up to LOAD_PROCESSES processes, so the load generator's own
    GIL does not cap the figure (one Python process with 32 busy threads spends most of its time
    handing the GIL around)."""
    nproc = min(conc, LOAD_PROCESSES)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with Client(url, timeout=TIMEOUT_S) as stats_client:
        start = time.time() + 2.0  # time for the processes to start and connect
        clock = (start, start + duration_s)
        per_proc = [conc // nproc + (1 if i < conc % nproc else 0) for i in range(nproc)]
        procs = [ctx.Process(target=_load_process, args=(url, n, clock, max(1, cap // conc), results))
                 for n in per_proc]  # fmt: skip
        for p in procs:
            p.start()
        time.sleep(max(0.0, start - time.time() - 0.2))
        before = model_stats(stats_client, "add")
        got = [results.get(timeout=duration_s + 3 * TIMEOUT_S) for _ in procs]
        elapsed = min(duration_s, time.time() - start)
        after = model_stats(stats_client, "add")
        for p in procs:
            p.join(TIMEOUT_S)
    done = sum(g[0] for g in got)
    errors = [e for g in got for e in g[2]]
    if errors or sum(g[1] for g in got) != conc:
        raise RuntimeError(f"concurrency {conc}: errors {errors[:3]}")
    return {"concurrency": conc, "processes": nproc, "requests": done, "seconds": elapsed,
            "req_per_s": done / elapsed, "mean_batch": mean_batch(before, after)}  # fmt: skip


# ------------------------------------------------------------------------------------------ (c) 16 MiB


def big_tensor(url: str, n: int, zero_copy: bool, shape: tuple[int, int] = BIG_SHAPE) -> dict[str, float]:
    with Client(url, timeout=TIMEOUT_S) as c:
        x = c.empty(shape, np.float32) if zero_copy else np.empty(shape, np.float32)
        x[...] = np.arange(shape[1], dtype=np.float32)
        for _ in range(3):  # warm-up: arena growth, page faults in the worker
            c.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
        before = model_stats(c, "identity")
        times: list[float] = []
        deadline = time.perf_counter() + LOOP_MAX_S
        while len(times) < n and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            y = c.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
            times.append(time.perf_counter() - t0)
            del y
        after = model_stats(c, "identity")
    keys = ("compute_input", "compute_infer", "compute_output")
    split = {k: timing_ns(before, after, k) / 1e9 for k in keys}
    return {"n": len(times), "e2e_s": statistics.median(times), "kernel_s": split["compute_infer"], **split}


# ------------------------------------------------------------------------------------------ (d) registration


def registration_us(url: str, n: int, seg_bytes: int = 1 << 20) -> list[float]:
    """Register and unregister one fresh arena segment ``n`` times (``Client.register_segment``, as the
    arena registers each of its segments); the registration times (µs)."""
    make = getattr(Segment, "create_sealed", Segment.create)
    out: list[float] = []
    with Client(url, timeout=TIMEOUT_S) as c:
        for _ in range(n):
            seg = make(seg_bytes)
            try:
                t0 = time.perf_counter()
                c.register_segment(seg)
                out.append((time.perf_counter() - t0) * 1e6)
                c.unregister_segment(seg)
            finally:
                seg.close()
    return out


def run_big(p: dict[str, Any]) -> dict[str, Any]:
    """(c) and (d) alone."""
    frames = bare_frames()
    with baseline.bare_hop() as ep:
        bare_lat = baseline.bare_latency_us(ep, frames, p["lat_n"])
    memcpy = {label: baseline.shm_memcpy_s(int(np.prod(shape)) * 4) for label, shape in SIZES.items()}
    with zinfer_server() as url:
        reg = registration_us(url, p["reg_n"])
        big = {
            label: {form: big_tensor(url, p["big_n"], form == "zero_copy", shape) for form in FORMS}
            for label, shape in SIZES.items()
        }
    for label, forms in big.items():
        for b in forms.values():
            b["overhead_over_memcpy"] = (b["e2e_s"] - b["kernel_s"]) / memcpy[label]
    return {
        "machine": machine(),
        "params": p,
        "big": {label: {"memcpy_s": memcpy[label], **forms} for label, forms in big.items()},
        "registration": {"zinfer_p50_us": pct(reg, 50), "bare_p50_us": pct(bare_lat, 50),
                         "ratio_p50": pct(reg, 50) / pct(bare_lat, 50), "n": len(reg)},
    }  # fmt: skip


def report_big(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(f"zinfer serving bench (c, d)  {m['date']}  cpus={m['cpu_count']} python={m['python']}")
    for label, forms in r["big"].items():
        print(f"\n(c) identity, {label} fp32; memcpy to shared memory {forms['memcpy_s'] * 1e3:.2f} ms")
        cols = f"{'e2e ms':>8}{'input ms':>10}{'kernel ms':>10}{'output ms':>10}{'(e2e-k)/memcpy':>15}"
        print(f"  {'form':10}{cols}")
        for form in FORMS:
            b = forms[form]
            print(f"  {form:10}{b['e2e_s'] * 1e3:8.2f}{b['compute_input'] * 1e3:10.2f}"
                  f"{b['kernel_s'] * 1e3:10.2f}{b['compute_output'] * 1e3:10.2f}"
                  f"{b['overhead_over_memcpy']:15.2f}")  # fmt: skip
    g = r["registration"]
    print(f"\n(d) registering a 1 MiB segment: p50 {g['zinfer_p50_us']:.1f} us; bare round trip "
          f"{g['bare_p50_us']:.1f} us; ratio {g['ratio_p50']:.2f}  (n={g['n']})")  # fmt: skip


# ---------------------------------------------------------------------------------------------- run


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyzmq": zmq.pyzmq_version(),
        "libzmq": zmq.zmq_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def record_run(results: Path, label: str, command: str, entry: dict[str, Any]) -> None:
    """Write ``entry`` as run ``label`` of a results file that keeps one entry per label
    (``{"runs": {...}}``), after its date, the command that made it and the machine; the other labels'
    entries stay."""
    doc: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    doc.setdefault("runs", {})[label] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "machine": machine(),
        **entry,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {results.relative_to(ROOT)} (label {label})")


def run(p: dict[str, Any]) -> dict[str, Any]:
    frames = bare_frames()
    with baseline.bare_hop() as ep:
        bare_lat = baseline.bare_latency_us(ep, frames, p["lat_n"])
        bare_rate = baseline.bare_rate(ep, frames, p["rate_n"], 32)
    memcpy_s = baseline.shm_memcpy_s(int(np.prod(BIG_SHAPE)) * 4)
    with zinfer_server() as url:
        lat = zinfer_latency_us(url, p["warmup"], p["lat_n"])
        steps = [throughput_step(url, k, p["step_s"], p["step_max"]) for k in CONCURRENCY]
        big = {form: big_tensor(url, p["big_n"], form == "zero_copy") for form in ("copied", "zero_copy")}
    for b in big.values():
        b["overhead_over_memcpy"] = (b["e2e_s"] - b["kernel_s"]) / memcpy_s
    at32 = next(s for s in steps if s["concurrency"] == 32)
    return {
        "machine": machine(),
        "params": p,
        "frame_bytes": [len(f) for f in frames],
        "latency": {
            "zinfer_p50_us": pct(lat, 50), "zinfer_p99_us": pct(lat, 99),
            "bare_p50_us": pct(bare_lat, 50), "bare_p99_us": pct(bare_lat, 99),
            "ratio_p50": pct(lat, 50) / pct(bare_lat, 50), "target": "<= 2", "n": len(lat),
        },
        "throughput": {"steps": steps, "bare_rate_window32": bare_rate,
                       "ratio_at_32": at32["req_per_s"] / bare_rate, "target": ">= 0.4"},
        "big_tensor": {"shape": list(BIG_SHAPE), "memcpy_s": memcpy_s, **big, "target": "<= 2"},
    }  # fmt: skip


def report(r: dict[str, Any]) -> None:
    m, lat, tp, big = r["machine"], r["latency"], r["throughput"], r["big_tensor"]
    print(f"zinfer serving bench  {m['date']}  cpus={m['cpu_count']} python={m['python']} "
          f"numpy={m['numpy']} pyzmq={m['pyzmq']}")  # fmt: skip
    print(f"\n(a) add, concurrency 1 (request frames {r['frame_bytes']} bytes)")
    print(f"  {'':8}{'p50 us':>10}{'p99 us':>10}")
    print(f"  {'zinfer':8}{lat['zinfer_p50_us']:10.1f}{lat['zinfer_p99_us']:10.1f}")
    print(f"  {'bare':8}{lat['bare_p50_us']:10.1f}{lat['bare_p99_us']:10.1f}")
    print(f"  p50 zinfer / bare = {lat['ratio_p50']:.2f}  (target <= 2)")
    print("\n(b) add, closed loop, one Client per thread, threads spread over up to 4 processes")
    print(f"  {'conc':>5}{'req/s':>10}{'mean batch':>12}{'requests':>10}")
    for s in tp["steps"]:
        print(f"  {s['concurrency']:5d}{s['req_per_s']:10.0f}{s['mean_batch']:12.2f}{s['requests']:10d}")
    print(f"  bare pipelined rate (window 32): {tp['bare_rate_window32']:.0f} msg/s")
    print(f"  throughput@32 / bare = {tp['ratio_at_32']:.2f}  (target >= 0.4)")
    print(f"\n(c) identity, {big['shape']} fp32 (16 MiB); memcpy to /dev/shm {big['memcpy_s'] * 1e3:.2f} ms")
    cols = f"{'e2e ms':>8}{'input ms':>10}{'kernel ms':>10}{'output ms':>10}{'(e2e-k)/memcpy':>15}"
    print(f"  {'form':10}{cols}")
    for form in ("copied", "zero_copy"):
        b = big[form]
        print(f"  {form:10}{b['e2e_s'] * 1e3:8.2f}{b['compute_input'] * 1e3:10.2f}{b['kernel_s'] * 1e3:10.2f}"
              f"{b['compute_output'] * 1e3:10.2f}{b['overhead_over_memcpy']:15.2f}")  # fmt: skip
    print("  target (e2e - kernel) / memcpy <= 2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts and durations (smoke test, < 30 s)")
    ap.add_argument("--big-only", action="store_true", help="only (c) and (d), with more repetitions")
    args = ap.parse_args()
    if args.big_only:
        t0 = time.perf_counter()
        big = run_big(BIG_ONLY)
        big["wall_s"] = time.perf_counter() - t0
        out = RESULTS.with_name("bench_serving_big.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(big, indent=2) + "\n")
        report_big(big)
        print(f"\nwrote {out.relative_to(ROOT)} in {big['wall_s']:.1f} s")
        return 0
    params = dict(QUICK if args.quick else FULL, quick=args.quick)
    t0 = time.perf_counter()
    results = run(params)
    results["wall_s"] = time.perf_counter() - t0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    report(results)
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {results['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
