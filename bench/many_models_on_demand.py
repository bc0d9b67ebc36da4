"""On-demand model control under a memory budget (issue 35), run by ``bench_many_models.py --on-demand``.

A repository of MODELS tiny CPU models (``scale_K``: Y = K * X, so every answer names the model that
computed it), served with ``--model-control-mode on-demand --memory-budget host=B`` where B holds SLOTS
instances (one instance's footprint is measured first, on a server without a budget: its worker's RSS).
CONCURRENCY closed-loop clients send REQUESTS requests whose models follow a Zipf law (P(rank r) ~ 1 / r^s,
ranks shuffled with a fixed seed). Every answer is checked.

A request is *cold* when a load of its model finished while it was in flight (it waited for that load; from
the server log's ``model_loaded_on_demand`` lines and the client's wall-clock send and receive times), else
*warm*. Reported: hit rate (warm share; beside it, an exact LRU cache's on the same plan, one request at a
time), p50/p99 of warm and of cold requests, loads and evictions per
second of workload, the server's cold-start times (first request to instances ready), errors and wrong
answers (both should be 0).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from zinfer.client import Client
from zinfer.client.paths import client_endpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_serving import _stop, _wait_ready, machine, pct  # noqa: E402

from tests.many_models import write_scale_repo  # noqa: E402

_LOADED = re.compile(r"^(\S+ \S+) .*event=model_loaded_on_demand model=(\S+) cold_start_s=([0-9.]+)", re.M)


@contextmanager
def serve(repo: Path, *flags: str) -> Iterator[tuple[str, Path]]:
    tmp = Path(tempfile.mkdtemp(prefix="zbod-", dir="/tmp"))
    log_path = tmp / "serve.log"
    cmd = [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repo),
           "--runtime-dir", str(tmp / "rt"), "--metrics", "127.0.0.1:0", "--model-control-mode", "on-demand",
           *flags]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(proc, log_path, 120.0)
        yield client_endpoint(tmp / "rt"), log_path
    finally:
        _stop(proc)


def instance_bytes(repo: Path) -> int:
    """One instance's measured footprint (worker RSS), on a server without a budget."""
    with serve(repo) as (url, _), Client(url, timeout=120) as c:
        for _ in range(50):  # a worker grows a little with its first requests: measured after them
            c.infer("scale_1", {"X": np.ones((1, 1), np.float32)})
        time.sleep(1.0)  # the next measurement (every 0.5 s)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = next(r for r in c.repository_index() if r["name"] == "scale_1")
            if int(row.get("resident_bytes", 0)) > 0:
                return int(row["resident_bytes"])
            time.sleep(0.1)
    raise RuntimeError("no footprint measured for scale_1")


def zipf_plan(models: int, requests: int, s: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, models + 1, dtype=np.float64)
    p = ranks**-s
    p /= p.sum()
    model_of_rank = rng.permutation(models) + 1  # rank r -> scale_K
    return [int(model_of_rank[i]) for i in rng.choice(models, size=requests, p=p)]


def lru_hit_rate(plan: list[int], slots: int) -> float:
    """The hit rate of an exact LRU cache of ``slots`` models replaying ``plan`` one request at a time: what
    the server's policy should match at concurrency 1 (concurrent requests for one model loading all wait)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in plan:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) > slots:
                cache.popitem(last=False)
    return hits / max(1, len(plan))


def _log_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run(
    models: int, slots: int, requests: int, concurrency: int, zipf_s: float, seed: int = 35
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zbod-repo-") as tmp:
        repo = Path(tmp) / "models"
        write_scale_repo(repo, models)
        footprint = instance_bytes(repo)
        budget = int((slots + 0.5) * footprint)
        plan = zipf_plan(models, requests, zipf_s, seed)
        shares = [plan[i::concurrency] for i in range(concurrency)]
        records: list[tuple[int, float, float, float]] = []  # model, wall send, wall receive, seconds
        errors: list[str] = []
        lock = threading.Lock()
        with serve(repo, "--memory-budget", f"host={budget}") as (url, log_path):

            def client(share: list[int], index: int) -> None:
                with Client(url, timeout=120) as c:
                    for i, k in enumerate(share):
                        x = float(index * 1000 + i % 997)
                        sent_wall, t0 = time.time(), time.perf_counter()
                        try:
                            y = c.infer(f"scale_{k}", {"X": np.full((1, 1), x, np.float32)}).as_numpy("Y")
                            ok = float(y[0, 0]) == k * x
                        except Exception as exc:  # noqa: BLE001 - counted and reported
                            with lock:
                                errors.append(f"scale_{k}: {type(exc).__name__}: {exc}")
                            continue
                        seconds = time.perf_counter() - t0
                        with lock:
                            records.append((k, sent_wall, time.time(), seconds))
                            if not ok:
                                errors.append(f"scale_{k}({x}) wrong: {y}")

            t0 = time.monotonic()
            threads = [threading.Thread(target=client, args=(share, i)) for i, share in enumerate(shares)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            duration = time.monotonic() - t0
            metrics = _metrics(log_path)
            log = log_path.read_text(errors="replace")
    loads = [(m, _log_time(ts), float(s)) for ts, m, s in _LOADED.findall(log)]
    evictions = log.count("event=model_evicted ")
    cold, warm = [], []
    for k, sent, received, seconds in records:
        name = f"scale_{k}"
        waited = any(m == name and sent - 0.002 <= at <= received + 0.002 for m, at, _ in loads)
        (cold if waited else warm).append(seconds * 1000)
    cold_starts = [s * 1000 for _, _, s in loads]

    def summary(xs: list[float]) -> dict[str, Any]:
        return {"count": len(xs), "p50_ms": round(pct(xs, 50), 3) if xs else None,
                "p99_ms": round(pct(xs, 99), 3) if xs else None}  # fmt: skip

    return {
        "machine": machine(),
        "models": models, "slots": slots, "requests": requests, "concurrency": concurrency, "zipf_s": zipf_s,
        "instance_bytes": footprint, "budget_bytes": budget,
        "duration_s": round(duration, 2),
        "hit_rate": round(len(warm) / max(1, len(records)), 4),
        "lru_replay_hit_rate": round(lru_hit_rate(plan, slots), 4),
        "warm": summary(warm), "cold": summary(cold),
        "loads": len(loads), "loads_per_s": round(len(loads) / duration, 3),
        "evictions": evictions, "evictions_per_s": round(evictions / duration, 3),
        "cold_start_server_ms": summary(cold_starts),
        "errors": len(errors), "error_samples": errors[:5],
        "max_resident_models": metrics.get("max_resident"),
    }  # fmt: skip


def _metrics(log_path: Path) -> dict[str, Any]:
    """A last look at /metrics: how many models are resident at the end."""
    text = log_path.read_text(errors="replace")
    m = re.search(r"event=http_listening address=(\S+)", text)
    if m is None:
        return {}
    try:
        with urllib.request.urlopen(f"http://{m.group(1)}/metrics", timeout=10) as r:
            body = r.read().decode()
    except OSError:
        return {}
    resident = re.findall(r'^zinfer_model_resident_bytes\{memory="host",model="[^"]+"\} (\S+)', body, re.M)
    return {"max_resident": sum(1 for v in resident if float(v) > 0)}


def report(r: dict[str, Any]) -> str:
    w, c, cs = r["warm"], r["cold"], r["cold_start_server_ms"]
    return (
        f"{r['models']} models, budget for {r['slots']} ({r['budget_bytes'] / 2**20:.0f} MiB, one instance "
        f"{r['instance_bytes'] / 2**20:.1f} MiB), Zipf s={r['zipf_s']}, {r['requests']} requests at "
        f"concurrency {r['concurrency']} in {r['duration_s']:.1f} s\n"
        f"  hit rate {r['hit_rate'] * 100:.1f}% "
        f"(exact LRU, one at a time: {r['lru_replay_hit_rate'] * 100:.1f}%)"
        f"   warm p50 {w['p50_ms']} ms p99 {w['p99_ms']} ms "
        f"({w['count']})   cold p50 {c['p50_ms']} ms p99 {c['p99_ms']} ms ({c['count']})\n"
        f"  loads {r['loads']} ({r['loads_per_s']:.2f}/s)   evictions {r['evictions']} "
        f"({r['evictions_per_s']:.2f}/s)   server cold start p50 {cs['p50_ms']} ms p99 {cs['p99_ms']} ms   "
        f"errors {r['errors']}"
    )
