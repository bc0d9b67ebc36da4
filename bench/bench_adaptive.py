"""Adaptive batching benchmark (issue 4): a latency target against static queue delays, open-loop load.

One ``zinfer serve`` on a temporary repository of identical ``linear`` models (X [*, IN] . W [IN, OUT] fp32,
max_batch_size 32, one CPU instance each), one model per batching configuration: ``lin_d0``, ``lin_d100``,
``lin_d500``, ``lin_d2000`` (static ``max_queue_delay_microseconds``) and ``lin_adaptive``
(``zinfer_latency_target_microseconds``).

1. Calibration on ``lin_d0``: one client, closed loop, requests carrying their own n rows, so every
   execution is one request of n rows and nothing queues. Per size: kernel time (compute input + infer +
   output per execution, from the statistics), broker time (arrival to reply) and client time; a fixed +
   per-row line is fitted. Then CLOSED_CONCURRENCY requests kept outstanding (a closed loop) give the
   saturation rate of the whole machine (sender, broker and instance share its cores). The three rates
   are fractions of that saturation rate; the latency target follows TARGET_RULE.
2. For each rate, ROUNDS rounds; in each round every configuration in turn (never two at once, in an order
   rotated per round so slow spells of a shared machine do not all fall on one) gets the same seeded
   Poisson schedule: open loop, every request goes at its scheduled time whatever the completions. One
   load process sends it: one asyncio event loop with one AsyncClient starts each request as a task at its
   time (asyncio's timers wake within about a millisecond) and keeps any number in flight, bounded by
   SENDER_MAX_IN_FLIGHT and the run's window. A thread per request in flight (128 of them, as before)
   spent the cores the broker and the instance need on a small machine. Each request's scheduled, send
   and completion times are recorded; failures are counted and reported. The aggregation and the
   statistics calls run in the main process, between runs.
3. Per rate and configuration, over its rounds: achieved throughput, client-side p50/p99 latency (send to
   completion), the server-side p50/p99 (arrival at the broker to the reply: queue plus compute, the
   latency the target is about and the adaptive mode controls, from the ``latency_us`` histogram of the
   statistics, exact to 5%), the senders' lag behind the schedule, mean executed batch size and batch
   reasons (from the difference of two statistics calls around each run), and whether the server-side
   p99 meets the target (the client-side p99 adds the client library, the socket hops and, on a small
   machine, the sender's own scheduling; it is printed beside). Beside it,
   the broker's virtual-time simulator (zinfer.broker.batching.simulate) runs the same policies on the same
   schedules with the calibrated batch costs: what the policy does without CPU contention.

Target: at every rate the adaptive mode meets its latency target and reaches at least the throughput of the
best static delay that also meets it (within THROUGHPUT_TOL: open loop, all that keep up carry the offered
load). PASS/MISS per rate is printed as measured.

Usage: ``.venv/bin/python bench/bench_adaptive.py [--quick]``. Results: bench/results/bench_adaptive.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.broker.batching.batch_policy import BatchPolicy
from zinfer.broker.batching.simulate import simulate
from zinfer.client.async_client import AsyncClient
from zinfer.client.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import machine, pct  # noqa: E402
from bench_serving import zinfer_server as serving_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "bench_adaptive.json"

# X [*, IN] . W [IN, OUT] fp32: big enough that the instance, not the broker or the senders, is what the
# load saturates on a 2-core machine (a batch of 32 takes ~13 ms; a lone row ~2.5 ms, through NumPy's GEMV,
# while 2 to 8 rows take ~6 ms, through a GEMM that packs W first).
IN_DIM, OUT_DIM = 4096, 4096
MAX_BATCH = 32
STATIC_DELAYS_US = (0, 100, 500, 2000)
ADAPTIVE = "lin_adaptive"
RATE_FRACTIONS = {"light": 0.1, "medium": 0.4, "near_saturation": 0.75}  # of the closed-loop saturation rate
# The latency target: TARGET_X_BATCH1 x the batch-1 cost, raised where needed to TARGET_X_NEEDED x the cost
# of the smallest batch that carries the near-saturation rate (client-side line fit). A target that no batch
# size can meet at that rate tests nothing: a request waits for the batch in progress, then runs in its own.
TARGET_X_BATCH1 = 5.0
TARGET_X_NEEDED = 4.0
TARGET_RULE = (
    f"max({TARGET_X_BATCH1:g} x batch-1 client p50, {TARGET_X_NEEDED:g} x client cost of the smallest batch "
    "carrying the near-saturation rate), rounded up to 0.1 ms"
)
THROUGHPUT_TOL = 0.02  # adaptive within 2% of the best static delay counts as reaching it
CAL_SIZES = (1, 2, 4, 8, 16, 32)
FULL = {"rounds": 4, "round_s": 3.0, "round_max": 20_000, "cal_reps": 40, "warm_reps": 4, "sat_s": 3.0}
QUICK = {"rounds": 1, "round_s": 1.5, "round_max": 5_000, "cal_reps": 12, "warm_reps": 2, "sat_s": 1.0}
CLOSED_CONCURRENCY = 128  # requests outstanding in the closed loop that measures saturation
SENDER_MAX_IN_FLIGHT = 4096  # the open loop sends no more while this many wait for replies (recorded)
TIMEOUT_S = 10.0  # every request's and every queue receive's timeout
START_LEAD_S = 0.3  # from handing out a run to its first scheduled send
LOOP_MAX_S = 60.0  # a calibration loop stops here even if its count is not reached
# One BLAS thread per worker: "one CPU instance" uses one core, and on a small machine a second BLAS thread
# only fights the broker and the sender (OpenBLAS's spinning threads then make a batch cost 10x more).
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Record = tuple[int, float, float, float, str]  # index, scheduled, sent, done (monotonic s), error ("" = ok)


def lin_model(delay_us: int | None) -> str:
    return ADAPTIVE if delay_us is None else f"lin_d{delay_us}"


CONFIGS: tuple[str, ...] = tuple(lin_model(d) for d in STATIC_DELAYS_US) + (ADAPTIVE,)


# ---------------------------------------------------------------------------------------------- repository


def _config(name: str, batching: str) -> str:
    return f"""name: "{name}"
backend: "zinfer"
max_batch_size: {MAX_BATCH}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {IN_DIM} ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {OUT_DIM} ] }} ]
dynamic_batching {{ {batching} }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters [ {{ key: "kernel" value: {{ string_value: "linear" }} }} ]
"""


def write_repository(repo: Path, target_us: int) -> None:
    """Every configuration as its own model, all with the same weights (written once, hard-linked)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((IN_DIM, OUT_DIM)) / math.sqrt(IN_DIM)).astype(np.float32)
    b = np.zeros(OUT_DIM, np.float32)
    first: Path | None = None
    for d in (*STATIC_DELAYS_US, None):
        name = lin_model(d)
        batching = (
            f"zinfer_latency_target_microseconds: {target_us}"
            if d is None
            else f"max_queue_delay_microseconds: {d}"
        )
        vdir = repo / name / "1"
        vdir.mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_config(name, batching))
        if first is None:
            np.save(vdir / "W.npy", w)
            np.save(vdir / "b.npy", b)
            first = vdir
        else:
            for f in ("W.npy", "b.npy"):
                os.link(first / f, vdir / f)


# ---------------------------------------------------------------------------------------------- server


def zinfer_server(repo: Path, load: tuple[str, ...], ready_timeout_s: float = 90.0) -> Any:
    """``zinfer serve`` on ``repo`` with explicit model control, ``load`` loaded at start, one BLAS thread."""
    extra = (
        "--no-metrics",
        "--model-control-mode",
        "explicit",
        *(a for n in load for a in ("--load-model", n)),
    )
    return serving_server(ready_timeout_s, extra, repo, dict(os.environ, **BLAS_ENV), all_loaded=True)


# ---------------------------------------------------------------------------------------------- sender


def _x(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, IN_DIM)).astype(np.float32)


async def _infer(client: AsyncClient, model: str, x: np.ndarray) -> str:
    """One request; its error as text ("" = ok): counted and reported, the load goes on."""
    try:
        await client.infer(model, {"X": x}, client_timeout=TIMEOUT_S)
    except Exception as exc:
        return repr(exc)[:200]
    return ""


async def _open_loop(
    client: AsyncClient, model: str, x: np.ndarray, offsets: list[float], start: float, stop: float
) -> list[Record]:
    """Send request i at ``start + offsets[i]`` whatever the replies do; record each one.

    Bounded: nothing is sent past ``stop`` or with SENDER_MAX_IN_FLIGHT requests already out (both are
    recorded as not sent), and the wait for the last replies ends after TIMEOUT_S.
    """
    out: list[Record] = []
    pending: set[asyncio.Task[None]] = set()
    started: dict[int, tuple[float, float]] = {}  # index -> (scheduled, sent) until recorded

    async def one(idx: int, sched: float) -> None:
        started[idx] = (sched, time.monotonic())
        err = await _infer(client, model, x)
        out.append((idx, sched, started.pop(idx)[1], time.monotonic(), err))

    for idx, offset in enumerate(offsets):
        sched = start + offset
        if sched > stop:
            out.append((idx, sched, math.nan, math.nan, "not sent: past the run window"))
            continue
        wait = sched - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if len(pending) >= SENDER_MAX_IN_FLIGHT:
            out.append((idx, sched, math.nan, math.nan, "not sent: too many requests in flight"))
            continue
        task = asyncio.create_task(one(idx, sched))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        _, late = await asyncio.wait(pending, timeout=TIMEOUT_S + 5.0)
        for task in late:  # a reply that never came: cancelled (in the server too) and recorded as such
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    out += [(i, sched, sent, math.nan, "no reply within the run") for i, (sched, sent) in started.items()]
    return sorted(out, key=lambda r: r[0])


async def _closed_loop(
    client: AsyncClient, model: str, x: np.ndarray, start: float, stop: float
) -> tuple[int, list[str]]:
    """CLOSED_CONCURRENCY requests outstanding until ``stop``: the replies that came by then, and errors."""
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    done: list[int] = []
    errors: list[str] = []

    async def lane() -> None:
        n = 0
        while time.monotonic() < stop and not errors:
            err = await _infer(client, model, x)
            if err:
                errors.append(err)
            elif time.monotonic() <= stop:
                n += 1
        done.append(n)

    lanes = asyncio.gather(*(lane() for _ in range(CLOSED_CONCURRENCY)))
    await asyncio.wait_for(lanes, max(0.0, stop - time.monotonic()) + TIMEOUT_S + 5.0)
    return sum(done), errors


async def _serve_jobs(url: str, jobs: Any, results: Any) -> None:
    x = _x(1, 100)
    async with AsyncClient(url, timeout=TIMEOUT_S) as client:
        while True:
            try:  # bounded: an abandoned sender ends on its own
                job = await asyncio.to_thread(jobs.get, True, 600.0)
            except queue.Empty:
                return
            if job is None:
                return
            kind, model = job[0], job[1]
            if kind == "warm":  # metadata, and an arena grown to a closed loop's requests in flight
                errs = await asyncio.gather(*(_infer(client, model, x) for _ in range(CLOSED_CONCURRENCY)))
                results.put(("warm", [e for e in errs if e]))
            elif kind == "closed":
                results.put(("closed", await _closed_loop(client, model, x, job[2], job[3])))
            else:
                results.put(("run", await _open_loop(client, model, x, job[2], job[3], job[4])))


def _sender_process(url: str, jobs: Any, results: Any) -> None:
    """The load process: one event loop and one AsyncClient run the jobs it is handed until told to stop."""
    asyncio.run(_serve_jobs(url, jobs, results))


class Sender:
    """The load generator: one long-lived process (spawning one per run would cost more than a quick run)
    with one asyncio loop and one AsyncClient, apart from this process, which only hands out schedules and
    reads the statistics between runs; so the broker and the instance get the cores while a run lasts."""

    def __init__(self, url: str) -> None:
        ctx = mp.get_context("spawn")
        self.jobs = ctx.Queue()
        self.results = ctx.Queue()
        self.proc = ctx.Process(target=_sender_process, args=(url, self.jobs, self.results), daemon=True)
        self.proc.start()

    def close(self) -> None:
        self.jobs.put(None)
        self.proc.join(TIMEOUT_S + 5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)

    def _gather(self, kind: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                k, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError("the sender process died") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the sender did not answer {kind!r} within {timeout_s:.0f} s"
                    ) from None
                continue
            if k != kind:
                raise RuntimeError(f"sender answered {k!r}, expected {kind!r}")
            return payload

    def warm(self, model: str) -> list[str]:
        self.jobs.put(("warm", model))
        errors: list[str] = self._gather("warm", TIMEOUT_S + 30.0)
        return errors

    def closed(self, model: str, seconds: float) -> dict[str, Any]:
        """CLOSED_CONCURRENCY requests outstanding on ``model`` for ``seconds``: requests/s at saturation."""
        start = time.monotonic() + START_LEAD_S
        self.jobs.put(("closed", model, start, start + seconds))
        count, errors = self._gather("closed", START_LEAD_S + seconds + 2 * TIMEOUT_S + 30.0)
        if errors:
            raise RuntimeError(f"closed loop on {model} failed: {errors[:3]}")
        return {"concurrency": CLOSED_CONCURRENCY, "seconds": seconds, "req_per_s": count / seconds}

    def run(self, model: str, offsets: list[float], run_s: float) -> list[Record]:
        """Send ``offsets`` (seconds from the start) to ``model``, open loop; one record per request."""
        start = time.monotonic() + START_LEAD_S
        self.jobs.put(("run", model, offsets, start, start + run_s + 1.0))
        records: list[Record] = self._gather("run", START_LEAD_S + run_s + 2 * TIMEOUT_S + 30.0)
        return records


def poisson_offsets(rate: float, span_s: float, cap: int, seed: int) -> list[float]:
    """Seeded Poisson arrival offsets in [0, span_s), at most ``cap`` of them."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while len(out) < cap:
        t += rng.expovariate(rate)
        if t >= span_s:
            break
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------- statistics


def model_stats(client: Client, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.statistics(model)["model_stats"][0]
    return stats


def batch_diff(before: dict[str, Any], after: dict[str, Any]) -> Counter[int]:
    was = {b["batch_size"]: b["count"] for b in before["batch_stats"]}
    return Counter({b["batch_size"]: b["count"] - was.get(b["batch_size"], 0) for b in after["batch_stats"]})


def reasons_diff(before: dict[str, Any], after: dict[str, Any]) -> Counter[str]:
    was = before.get("batch_reasons", {})
    return Counter({r: n - was.get(r, 0) for r, n in after.get("batch_reasons", {}).items()})


def stat_diff(before: dict[str, Any], after: dict[str, Any], key: str) -> tuple[float, int]:
    """Total ns and count of one ``inference_stats`` field between two snapshots."""
    b, a = before["inference_stats"][key], after["inference_stats"][key]
    return float(a["ns"] - b["ns"]), int(a["count"] - b["count"])


def latency_diff(before: dict[str, Any], after: dict[str, Any]) -> Counter[float]:
    """Server-side latencies (bin upper bound in us -> count) between two snapshots."""
    was = {float(b): int(n) for b, n in before.get("latency_us", [])}
    return Counter({float(b): int(n) - was.get(float(b), 0) for b, n in after.get("latency_us", [])})


def bins_pct(bins: Counter[float], q: float) -> float:
    """The ``q`` percentile in ms of a latency histogram (the upper edge of the bin it falls in)."""
    total = sum(n for n in bins.values() if n > 0)
    if not total:
        return math.nan
    need, seen = q / 100 * total, 0
    for bound in sorted(bins):
        seen += max(bins[bound], 0)
        if seen >= need:
            return bound / 1e3
    return max(bins) / 1e3


def mean_size(sizes: Counter[int]) -> float:
    execs = sum(n for n in sizes.values() if n > 0)
    return sum(s * n for s, n in sizes.items() if n > 0) / execs if execs else math.nan


# ---------------------------------------------------------------------------------------------- calibration


def calibrate(url: str, reps: int) -> dict[str, Any]:
    """Cost of a batch of each size on ``lin_d0`` (module docstring, step 1). Medians over ``reps`` requests,
    each between two statistics calls, so that a slow spell of a shared machine does not move the line."""
    model = lin_model(0)
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + LOOP_MAX_S
    parts = ("compute_input", "compute_infer", "compute_output")
    with Client(url, timeout=TIMEOUT_S) as c:
        for n in CAL_SIZES:
            x = _x(n, n)
            for _ in range(3):  # warm-up of this size
                c.infer(model, {"X": x})
            kernel, broker, client = [], [], []
            before = model_stats(c, model)
            while len(client) < reps and time.monotonic() < deadline:
                t0 = time.perf_counter()
                c.infer(model, {"X": x})
                client.append((time.perf_counter() - t0) * 1e3)
                after = model_stats(c, model)
                kernel.append(sum(stat_diff(before, after, k)[0] for k in parts) / 1e6)
                broker.append(stat_diff(before, after, "success")[0] / 1e6)  # arrival to reply; no queue here
                before = after
            medians = {
                "kernel_ms": pct(kernel, 50),
                "broker_ms": pct(broker, 50),
                "client_ms": pct(client, 50),
            }
            rows.append({"size": n, "n": len(client), **medians})
    sizes = np.array([r["size"] for r in rows], float)
    fit = {}
    for key in ("kernel_ms", "broker_ms", "client_ms"):
        slope, icpt = np.polyfit(sizes, np.array([r[key] for r in rows]), 1)
        fit[key] = {"fixed_ms": float(icpt), "per_row_ms": float(slope)}
    for r in rows:
        r["rows_per_s"] = r["size"] / (r["broker_ms"] / 1e3)
    return {"sizes": rows, "fit": fit, "model_capacity_req_per_s": max(r["rows_per_s"] for r in rows)}


def choose_target(cal: dict[str, Any], near_rate: float) -> tuple[float, dict[str, Any]]:
    """The latency target in ms (TARGET_RULE) and what it came from."""
    b1 = next(r for r in cal["sizes"] if r["size"] == 1)["client_ms"]
    fit = cal["fit"]["client_ms"]
    cost = {m: fit["fixed_ms"] + fit["per_row_ms"] * m for m in range(2, MAX_BATCH + 1)}
    needed = next((m for m, c in cost.items() if m / c * 1e3 >= near_rate), MAX_BATCH)
    target = max(TARGET_X_BATCH1 * b1, TARGET_X_NEEDED * cost[needed])
    why = {"batch1_client_ms": b1, "near_saturation_batch": needed, "near_saturation_batch_ms": cost[needed]}
    return math.ceil(target * 10) / 10, why


def warm_model(pool: Sender, url: str, model: str, reps: int) -> None:
    """Metadata into the sender's AsyncClient, then every size a few times through the model: worker caches
    and, equally for every configuration, the first execution times the adaptive mode learns from."""
    errs = pool.warm(model)
    if errs:
        raise RuntimeError(f"warm-up of {model} failed: {errs[:3]}")
    with Client(url, timeout=TIMEOUT_S) as c:
        for n in CAL_SIZES:
            x = _x(n, n)
            for _ in range(reps):
                c.infer(model, {"X": x})


# ---------------------------------------------------------------------------------------------- runs


class Tally:
    """One configuration's records over the rounds of one rate."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.records: list[Record] = []
        self.busy_s = 0.0  # sum over rounds of first scheduled send to last completion
        self.sizes: Counter[int] = Counter()
        self.reasons: Counter[str] = Counter()
        self.round_p99_ms: list[float] = []
        self.server: Counter[float] = Counter()  # server-side latency histogram over the rounds

    def add(self, recs: list[Record], before: dict[str, Any], after: dict[str, Any]) -> None:
        self.records += recs
        ok = [r for r in recs if not r[4]]
        if ok:
            self.busy_s += max(r[3] for r in ok) - min(r[1] for r in recs)
            self.round_p99_ms.append(pct([(r[3] - r[2]) * 1e3 for r in ok], 99))
        self.sizes.update(batch_diff(before, after))
        self.reasons.update(reasons_diff(before, after))
        self.server.update(latency_diff(before, after))

    def summary(self, span_s: float, target_ms: float) -> dict[str, Any]:
        ok = [r for r in self.records if not r[4]]
        failed = [r for r in self.records if r[4]]
        lat = [(r[3] - r[2]) * 1e3 for r in ok]
        lag = [(r[2] - r[1]) * 1e3 for r in self.records if not math.isnan(r[2])]
        p99 = pct(lat, 99) if lat else math.nan
        return {
            "model": self.model,
            "requests": len(self.records),
            "ok": len(ok),
            "failed": len(failed),
            "errors": sorted({r[4] for r in failed})[:5],
            "offered_req_per_s": len(self.records) / span_s,
            "throughput_req_per_s": len(ok) / self.busy_s if self.busy_s > 0 else math.nan,
            "p50_ms": pct(lat, 50) if lat else math.nan,
            "p99_ms": p99,
            "round_p99_ms": self.round_p99_ms,
            "p99_from_schedule_ms": pct([(r[3] - r[1]) * 1e3 for r in ok], 99) if ok else math.nan,
            "send_lag_p99_ms": pct(lag, 99) if lag else math.nan,
            "mean_batch": mean_size(self.sizes),
            "executions": sum(n for n in self.sizes.values() if n > 0),
            "batch_sizes": {str(s): n for s, n in sorted(self.sizes.items()) if n > 0},
            "batch_reasons": {r: n for r, n in sorted(self.reasons.items()) if n > 0},
            "server_p50_ms": bins_pct(self.server, 50),
            "server_p99_ms": bins_pct(self.server, 99),
            "client_meets_target": bool(not failed and p99 <= target_ms),
            "meets_target": bool(not failed and bins_pct(self.server, 99) <= target_ms),
        }


def run_rate(
    pool: Sender, sc: Client, k: int, rate: float, p: dict[str, Any], target_ms: float
) -> tuple[dict[str, Any], list[list[float]]]:
    """Every configuration on the same schedules, ROUNDS rounds, configuration order rotated per round."""
    tallies = {m: Tally(m) for m in CONFIGS}
    schedules = []
    for rnd in range(p["rounds"]):
        offsets = poisson_offsets(rate, p["round_s"], p["round_max"], seed=1000 + 10 * k + rnd)
        schedules.append(offsets)
        shift = rnd % len(CONFIGS)
        for m in CONFIGS[shift:] + CONFIGS[:shift]:
            before = model_stats(sc, m)
            recs = pool.run(m, offsets, p["round_s"])
            tallies[m].add(recs, before, model_stats(sc, m))
    span = p["rounds"] * p["round_s"]
    return {m: t.summary(span, target_ms) for m, t in tallies.items()}, schedules


def simulated(cal: dict[str, Any], schedules: list[list[float]], target_ms: float) -> dict[str, Any]:
    """The same schedules through the broker's batcher in virtual time, batch costs from the calibration
    (broker time, linear between the calibrated sizes), latencies plus the calibrated client overhead."""
    sizes = [r["size"] for r in cal["sizes"]]
    costs = [r["broker_ms"] / 1e3 for r in cal["sizes"]]
    b1 = cal["sizes"][0]
    overhead_ms = max(0.0, b1["client_ms"] - b1["broker_ms"])

    def exec_s(rows: int) -> float:
        return float(np.interp(rows, sizes, costs))

    out = {}
    for m in CONFIGS:
        delay = None if m == ADAPTIVE else int(m.removeprefix("lin_d"))
        policy = (
            BatchPolicy(MAX_BATCH, latency_target_us=round(target_ms * 1000))
            if delay is None
            else BatchPolicy(MAX_BATCH, max_queue_delay_us=delay)
        )
        lat: list[float] = []
        batches: list[int] = []
        for offsets in schedules:
            if offsets:
                r = simulate(policy, offsets, exec_s)
                lat += [x * 1e3 + overhead_ms for x in r.latencies]
                batches += r.batch_sizes
        p99 = pct(lat, 99) if lat else math.nan
        out[m] = {
            "p50_ms": pct(lat, 50) if lat else math.nan,
            "p99_ms": p99,
            "mean_batch": sum(batches) / len(batches) if batches else math.nan,
            "meets_target": bool(p99 <= target_ms),
        }
    return out


def verdict(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ad = runs[ADAPTIVE]
    meeting = [runs[m] for m in CONFIGS if m != ADAPTIVE and runs[m]["meets_target"]]
    best = max(meeting, key=lambda r: r["throughput_req_per_s"], default=None)
    best_tp = best["throughput_req_per_s"] if best else None
    ratio = ad["throughput_req_per_s"] / best_tp if best_tp else None
    reaches = ratio is None or ratio >= 1 - THROUGHPUT_TOL
    return {
        "adaptive_meets_target": ad["meets_target"],
        "static_meeting_target": [r["model"] for r in meeting],
        "best_static_meeting_target": best["model"] if best else None,
        "best_static_throughput": best_tp,
        "adaptive_over_best_static": ratio,
        "result": "PASS" if ad["meets_target"] and reaches else "MISS",
    }


def run(p: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="zba-", dir="/tmp"))
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        repo = tmp / "repo"
        write_repository(repo, target_us=0)  # the adaptive model's config is rewritten after calibration
        with zinfer_server(repo, load=(lin_model(0),)) as url, Client(url, timeout=TIMEOUT_S) as sc:
            cal = calibrate(url, p["cal_reps"])
            pool = Sender(url)
            try:
                warm_model(pool, url, lin_model(0), p["warm_reps"])
                before = model_stats(sc, lin_model(0))
                sat = pool.closed(lin_model(0), p["sat_s"])
                sat["mean_batch"] = mean_size(batch_diff(before, model_stats(sc, lin_model(0))))
                rates = {name: frac * sat["req_per_s"] for name, frac in RATE_FRACTIONS.items()}
                target_ms, why = choose_target(cal, rates["near_saturation"])
                (repo / ADAPTIVE / "config.pbtxt").write_text(
                    _config(ADAPTIVE, f"zinfer_latency_target_microseconds: {round(target_ms * 1000)}")
                )
                for m in CONFIGS[1:]:
                    sc.load_model(m, timeout=120.0)
                    warm_model(pool, url, m, p["warm_reps"])
                _print_calibration(cal, sat, target_ms, why, rates)
                for k, (name, rate) in enumerate(rates.items()):
                    runs, schedules = run_rate(pool, sc, k, rate, p, target_ms)
                    sim = simulated(cal, schedules, target_ms)
                    v = verdict(runs)
                    seeds = [1000 + 10 * k + r for r in range(p["rounds"])]
                    results[name] = {"rate_req_per_s": rate, "seeds": seeds, "runs": runs, "simulated": sim,
                                     "verdict": v}  # fmt: skip
                    _print_rate(name, runs, sim, v)
            finally:
                pool.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "params": p,
        "model": {
            "in": IN_DIM,
            "out": OUT_DIM,
            "dtype": "fp32",
            "max_batch_size": MAX_BATCH,
            "instances": 1,
            "kind": "KIND_CPU",
            "blas_env": BLAS_ENV,
        },  # fmt: skip
        "sender": {
            "kind": "asyncio",
            "processes": 1,
            "clients": 1,
            "max_in_flight": SENDER_MAX_IN_FLIGHT,
            "closed_concurrency": CLOSED_CONCURRENCY,
            "timeout_s": TIMEOUT_S,
        },  # fmt: skip
        "calibration": cal,
        "saturation": sat,
        "rate_fractions_of_saturation": RATE_FRACTIONS,
        "target_ms": target_ms,
        "target_rule": TARGET_RULE,
        "target_inputs": why,
        "throughput_tolerance": THROUGHPUT_TOL,
        "rates": results,
    }


# ---------------------------------------------------------------------------------------------- report


def _print_calibration(
    cal: dict[str, Any], sat: dict[str, Any], target_ms: float, why: dict[str, Any], rates: dict[str, float]
) -> None:
    print(f"calibration: linear X[*,{IN_DIM}] . W[{IN_DIM},{OUT_DIM}] fp32, one CPU instance, one client")
    print(f"  {'rows':>5}{'kernel ms':>11}{'broker ms':>11}{'client ms':>11}{'rows/s':>10}")
    for r in cal["sizes"]:
        print(f"  {r['size']:5d}{r['kernel_ms']:11.3f}{r['broker_ms']:11.3f}{r['client_ms']:11.3f}"
              f"{r['rows_per_s']:10.0f}")  # fmt: skip
    for key, f in cal["fit"].items():
        print(f"  fit {key:10} {f['fixed_ms']:.3f} ms + {f['per_row_ms']:.4f} ms/row")
    print(f"  model capacity (best rows/s of any size, broker time): {cal['model_capacity_req_per_s']:.0f}/s")
    print(f"  saturation (closed loop, {sat['concurrency']} clients, {sat['seconds']:g} s): "
          f"{sat['req_per_s']:.0f} req/s, mean batch {sat['mean_batch']:.1f}")  # fmt: skip
    print("  rates: " + ", ".join(f"{n} {r:.0f}/s ({RATE_FRACTIONS[n]:.0%})" for n, r in rates.items()))
    b1, m, cost = why["batch1_client_ms"], why["near_saturation_batch"], why["near_saturation_batch_ms"]
    print(f"  latency target: {target_ms:.1f} ms = max({TARGET_X_BATCH1:g} x {b1:.2f} ms (1 row), "
          f"{TARGET_X_NEEDED:g} x {cost:.2f} ms ({m} rows, the smallest batch carrying the near-saturation "
          "rate))", flush=True)  # fmt: skip


def _print_rate(name: str, runs: dict[str, Any], sim: dict[str, Any], v: dict[str, Any]) -> None:
    r0 = runs[CONFIGS[0]]
    print(
        f"\n{name}: {r0['offered_req_per_s']:.0f} req/s offered, {r0['requests']} requests per configuration"
    )
    print(f"  {'model':14}{'tput/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'srv p99':>8}{'lag99':>7}{'batch':>7}"
          f"{'fail':>5}  {'target':7}{'sim p99':>8}{'sim batch':>10}  client round p99s")  # fmt: skip
    for m in CONFIGS:
        r, s = runs[m], sim[m]
        rounds = " ".join(f"{x:.0f}" for x in r["round_p99_ms"])
        print(f"  {m:14}{r['throughput_req_per_s']:8.0f}{r['p50_ms']:8.2f}{r['p99_ms']:8.2f}"
              f"{r['server_p99_ms']:8.2f}{r['send_lag_p99_ms']:7.2f}{r['mean_batch']:7.2f}{r['failed']:5d}  "
              f"{'meets' if r['meets_target'] else 'misses':7}{s['p99_ms']:8.2f}{s['mean_batch']:10.2f}"
              f"  {rounds}")  # fmt: skip
        if r["errors"]:
            print(f"      errors: {r['errors']}")
    best = v["best_static_meeting_target"]
    cmp = (f"best static meeting it: {best} {v['best_static_throughput']:.0f}/s, adaptive/best "
           f"{v['adaptive_over_best_static']:.3f}" if best else "no static delay meets it")  # fmt: skip
    met = "meets" if v["adaptive_meets_target"] else "MISSES"
    print(f"  adaptive {met} the target; {cmp}  -> {v['result']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round per rate (smoke test, < 60 s)")
    args = ap.parse_args()
    params = dict(QUICK if args.quick else FULL, quick=args.quick)
    t0 = time.perf_counter()
    results = run(params)
    results["wall_s"] = time.perf_counter() - t0
    results["summary"] = {name: r["verdict"]["result"] for name, r in results["rates"].items()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    m = results["machine"]
    print(f"\nmachine: cpus={m['cpu_count']} python={m['python']} numpy={m['numpy']} pyzmq={m['pyzmq']} "
          f"load average before {m['loadavg_before'][0]:.2f}, after {m['loadavg_after'][0]:.2f}")  # fmt: skip
    print(
        f"target {results['target_ms']:.1f} ms; "
        + ", ".join(f"{k} {v}" for k, v in results["summary"].items())
    )
    print(f"wrote {RESULTS.relative_to(ROOT)} in {results['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
