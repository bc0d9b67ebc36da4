"""Load generation for ``zinfer perf``: one measurement step, closed loop or open loop, sync or asyncio.

A step runs until its measurement interval passes or its request bound is reached, then waits for what is
still in flight. Concurrency mode keeps N requests outstanding (N threads sharing one ``Client``, or N
tasks on one ``AsyncClient``); request-rate mode sends at a fixed rate, evenly spaced or Poisson, whatever
the answers do, and counts each latency from the request's scheduled time, so a client or server that
falls behind shows up in the latency instead of hiding in a lower rate.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

_DRAIN_S = 30.0  # how long a step waits for its last requests after it stops sending


@dataclass(frozen=True)
class Step:
    """One measurement: ``concurrency`` requests outstanding, or ``rate`` requests per second."""

    concurrency: int | None = None
    rate: float | None = None
    distribution: str = "constant"  # request-rate mode: "constant" or "poisson"
    interval_s: float = 5.0
    max_requests: int = 0  # 0: bounded by the interval only

    @property
    def label(self) -> str:
        if self.rate is not None:
            return f"rate {self.rate:g}/s"
        return f"concurrency {self.concurrency}"


@dataclass
class Tally:
    """What a step has done so far: read by the progress line while it runs."""

    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # "Type: message" -> count
    issued: int = 0
    started: float = 0.0
    finished: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def done(self) -> int:
        return len(self.latencies_s) + sum(self.errors.values())

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def claim(self, step: Step, deadline: float) -> bool:
        """Whether one more request may be sent (and count it)."""
        with self._lock:
            if time.perf_counter() >= deadline or (step.max_requests and self.issued >= step.max_requests):
                return False
            self.issued += 1
            return True

    def ok(self, started: float) -> None:
        now = time.perf_counter()
        self.latencies_s.append(now - started)
        self.finished = now

    def failed(self, exc: BaseException) -> None:
        key = f"{type(exc).__name__}: {exc}"[:200]
        with self._lock:
            self.errors[key] = self.errors.get(key, 0) + 1
            self.finished = time.perf_counter()


def send_times(rate: float, distribution: str, seed: int = 0) -> Iterator[float]:
    """Offsets in seconds from the start of a step at which to send, for ``rate`` requests a second."""
    rng = random.Random(seed)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate) if distribution == "poisson" else 1.0 / rate


# ---------------------------------------------------------------------------------------------- sync


def run_sync(call: Callable[[], object], step: Step, tally: Tally, max_threads: int = 64) -> None:
    """One step with threads; ``call`` sends one request and waits for its answer."""
    tally.started = time.perf_counter()
    deadline = tally.started + step.interval_s
    if step.rate is None:
        threads = [
            threading.Thread(target=_closed_loop, args=(call, step, tally, deadline), daemon=True)
            for _ in range(step.concurrency or 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(step.interval_s + _DRAIN_S)
        return
    with ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="zinfer-perf") as pool:
        for offset in send_times(step.rate, step.distribution):
            due = tally.started + offset
            if due >= deadline or not tally.claim(step, deadline):
                break
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            pool.submit(_one, call, tally, due)


def _closed_loop(call: Callable[[], object], step: Step, tally: Tally, deadline: float) -> None:
    while tally.claim(step, deadline):
        _one(call, tally, time.perf_counter())


def _one(call: Callable[[], object], tally: Tally, started: float) -> None:
    try:
        call()
    except Exception as exc:  # counted, and the load goes on
        tally.failed(exc)
    else:
        tally.ok(started)


# ---------------------------------------------------------------------------------------------- async


async def run_async(call: Callable[[], Awaitable[object]], step: Step, tally: Tally) -> None:
    """One step with tasks on the running loop; ``call`` sends one request and awaits its answer."""
    tally.started = time.perf_counter()
    deadline = tally.started + step.interval_s
    if step.rate is None:
        workers = [_closed_loop_async(call, step, tally, deadline) for _ in range(step.concurrency or 1)]
        await asyncio.wait_for(asyncio.gather(*workers), step.interval_s + _DRAIN_S)
        return
    pending: set[asyncio.Task[None]] = set()
    for offset in send_times(step.rate, step.distribution):
        due = tally.started + offset
        if due >= deadline or not tally.claim(step, deadline):
            break
        pause = due - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)
        task = asyncio.ensure_future(_one_async(call, tally, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=_DRAIN_S)


async def _closed_loop_async(
    call: Callable[[], Awaitable[object]], step: Step, tally: Tally, deadline: float
) -> None:
    while tally.claim(step, deadline):
        await _one_async(call, tally, time.perf_counter())


async def _one_async(call: Callable[[], Awaitable[object]], tally: Tally, started: float) -> None:
    try:
        await call()
    except Exception as exc:  # counted, and the load goes on
        tally.failed(exc)
    else:
        tally.ok(started)
