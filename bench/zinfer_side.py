"""zinfer's half of ``bench_vs_triton.py``: a ``zinfer serve`` whose processes are known by pid (for their CPU
time), and the load shapes, each a closed loop bounded in time and count.

CPU per request: user+system seconds of the broker, of its workers (every child process) and of this
client process over one step, divided by the requests the step completed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from zinfer.client import AsyncClient, Client
from zinfer.client.paths import client_endpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from bench_serving import _stop, _wait_ready, pct  # noqa: E402
from vs_triton_repo import BIG_ELEMENTS, EXPECTED, TEXT  # noqa: E402

TIMEOUT_S = 30.0
ADD_INPUTS = {"INPUT_A": np.ones((1, 1), np.float32), "INPUT_B": np.full((1, 1), 2.0, np.float32)}
TEXT_INPUTS = {"TEXT": np.array([[TEXT]], dtype=object)}


@dataclass(frozen=True)
class ZinferServer:
    url: str
    pid: int


@contextmanager
def serve(repository: Path) -> Iterator[ZinferServer]:
    tmp = Path(tempfile.mkdtemp(prefix="zbt-", dir="/tmp"))
    log_path = tmp / "serve.log"
    cmd = [sys.executable, "-m", "zinfer.broker", "serve", "--model-repository", str(repository)]
    cmd += ["--runtime-dir", str(tmp / "rt"), "--metrics", "127.0.0.1:0"]
    proc = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(proc, log_path, 120.0, all_loaded=True)
        yield ZinferServer(client_endpoint(tmp / "rt"), proc.pid)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


class CpuMeter:
    """CPU seconds of the broker, its workers and this process between ``start`` and ``stop``."""

    def __init__(self, broker_pid: int) -> None:
        self.broker = psutil.Process(broker_pid)
        self.me = psutil.Process(os.getpid())
        self._t0: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        try:
            children = [c.pid for c in self.broker.children(recursive=True)]
        except psutil.Error:
            children = []
        return {
            "broker": baseline.process_cpu_s(self.broker.pid),
            "workers": sum(baseline.process_cpu_s(c) for c in children),
            "client": baseline.process_cpu_s(self.me.pid),
        }

    def start(self) -> None:
        self._t0 = self._sample()

    def stop(self, requests: int) -> dict[str, float]:
        t1 = self._sample()
        per = {k: (t1[k] - self._t0[k]) / max(1, requests) * 1e6 for k in t1}
        per["total"] = sum(per.values())
        return {f"{k}_us": round(v, 1) for k, v in per.items()}


def _step(
    requests: int, seconds: float, lats: list[float], errors: int, cpu: dict[str, float]
) -> dict[str, Any]:
    return {
        "requests": requests,
        "duration_s": round(seconds, 3),
        "throughput_s": round(requests / seconds, 1) if seconds else 0.0,
        "p50_us": round(pct(lats, 50), 1) if lats else 0.0,
        "p99_us": round(pct(lats, 99), 1) if lats else 0.0,
        "errors": errors,
        "cpu_per_request": cpu,
    }


def _check(model: str, result: Any) -> bool:
    if model == "text_ensemble":
        return bytes(result.as_numpy("RESULT")[0, 0]) == EXPECTED
    if model == "big":
        return bool(result.as_numpy("OUTPUT0")[0, -1] == 1.0)
    return bool(result.as_numpy("OUTPUT_SUM")[0, 0] == 3.0)


def inputs_of(model: str) -> dict[str, Any]:
    """The inputs a load sends to ``model``: the text ensemble's, or add's."""
    return TEXT_INPUTS if model == "text_ensemble" else ADD_INPUTS


def warm_up(c: Client, model: str) -> None:
    """100 calls of ``model``, each answer checked."""
    inputs = inputs_of(model)
    for _ in range(100):
        if not _check(model, c.infer(model, inputs)):
            raise RuntimeError(f"{model}: wrong result")


def timed_calls(c: Client, model: str, seconds: float, cap: int) -> tuple[list[float], float]:
    """One call of ``model`` after another for ``seconds`` (at most ``cap``): each latency in µs, and the
    seconds it took."""
    inputs = inputs_of(model)
    lats: list[float] = []
    t0 = time.perf_counter()
    end = t0 + seconds
    while len(lats) < cap and time.perf_counter() < end:
        t = time.perf_counter()
        c.infer(model, inputs)
        lats.append((time.perf_counter() - t) * 1e6)
    return lats, time.perf_counter() - t0


def sync_latency(s: ZinferServer, model: str, seconds: float, cap: int) -> dict[str, Any]:
    """One sync ``Client``, one request in flight."""
    meter = CpuMeter(s.pid)
    with Client(s.url, timeout=TIMEOUT_S) as c:
        warm_up(c, model)
        meter.start()
        lats, dt = timed_calls(c, model, seconds, cap)
    return _step(len(lats), dt, lats, 0, meter.stop(len(lats)))


def async_closed(s: ZinferServer, model: str, concurrency: int, seconds: float, cap: int) -> dict[str, Any]:
    """One ``AsyncClient``, ``concurrency`` tasks in closed loops."""
    inputs = inputs_of(model)

    async def go() -> dict[str, Any]:
        async with AsyncClient(s.url, timeout=TIMEOUT_S) as c:
            for _ in range(50):
                if not _check(model, await c.infer(model, inputs)):
                    raise RuntimeError(f"{model}: wrong result")
            lats: list[float] = []
            errors = 0
            meter = CpuMeter(s.pid)
            end = time.perf_counter() + seconds

            async def loop() -> None:
                nonlocal errors
                while len(lats) < cap and time.perf_counter() < end:
                    t = time.perf_counter()
                    try:
                        await c.infer(model, inputs)
                    except Exception:
                        errors += 1
                    lats.append((time.perf_counter() - t) * 1e6)

            meter.start()
            t0 = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            dt = time.perf_counter() - t0
            return _step(len(lats), dt, lats, errors, meter.stop(len(lats)))

    return asyncio.run(go())


def threads(
    s: ZinferServer,
    model: str,
    n: int,
    seconds: float,
    cap: int,
    shared: bool,
    make_inputs: Callable[[Client], Any],
) -> dict[str, Any]:
    """``n`` threads in closed loops, a ``Client`` each or one shared ``Client``."""
    clients = (
        [Client(s.url, timeout=TIMEOUT_S)] if shared else [Client(s.url, timeout=TIMEOUT_S) for _ in range(n)]
    )
    counts = [0] * n
    lats: list[list[float]] = [[] for _ in range(n)]
    errors = [0] * n
    barrier = threading.Barrier(n + 1)
    end = [0.0]

    def loop(i: int) -> None:
        c = clients[0 if shared else i]
        inputs = make_inputs(c)
        try:
            for _ in range(20):
                if not _check(model, c.infer(model, inputs)):
                    errors[i] += 1
        finally:
            barrier.wait()
        mine = lats[i]
        while counts[i] < cap and time.perf_counter() < end[0]:
            t = time.perf_counter()
            try:
                c.infer(model, inputs)
            except Exception:
                errors[i] += 1
            mine.append((time.perf_counter() - t) * 1e6)
            counts[i] += 1

    meter = CpuMeter(s.pid)
    ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in ts:
            t.start()
        end[0] = time.perf_counter() + 3600
        barrier.wait(timeout=120)
        meter.start()
        t0 = time.perf_counter()
        end[0] = t0 + seconds
        for t in ts:
            t.join(seconds + 60)
        dt = time.perf_counter() - t0
    finally:
        for c in clients:
            c.close()
    total = sum(counts)
    return _step(total, dt, [x for xs in lats for x in xs], sum(errors), meter.stop(total))


def add_inputs(_: Client) -> dict[str, Any]:
    return ADD_INPUTS


def big_inputs(c: Client) -> dict[str, Any]:
    """4 MiB of FP32 built in the client's shared memory (``client.empty``): sent by descriptor."""
    x = c.empty((1, BIG_ELEMENTS), np.float32)
    x.fill(1.0)
    return {"INPUT0": x}
