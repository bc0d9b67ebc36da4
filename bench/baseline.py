"""Raw limits measured in the same run as zinfer: a bare ZeroMQ round trip through one ROUTER hop, and
memcpy into /dev/shm.

The bare path is client DEALER -> forwarding process (ROUTER front, ROUTER back) -> worker process DEALER
that echoes -> back the same way: the shape of zinfer's path with none of its work.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import zmq


def _forwarder(front_ep: str, back_ep: str) -> None:
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.bind(front_ep)
    back = ctx.socket(zmq.ROUTER)
    back.bind(back_ep)
    worker_id = back.recv_multipart()[0]  # the worker says hello first
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    while True:
        events = dict(poller.poll(1000))
        if front in events:
            while True:
                try:
                    client, *rest = front.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if rest and rest[0].bytes == b"stop":
                    return
                back.send_multipart([worker_id, client, *rest], copy=False)
        if back in events:
            while True:
                try:
                    _, client, *rest = back.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                front.send_multipart([client, *rest], copy=False)


def _echo_worker(back_ep: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(back_ep)
    sock.send(b"hello")
    while True:
        if not sock.poll(10_000):
            return
        msg = sock.recv_multipart(copy=False)
        if len(msg) >= 2 and msg[1].bytes == b"stop":
            return
        sock.send_multipart(msg, copy=False)


@contextmanager
def bare_hop() -> Iterator[str]:
    """A forwarder and an echo worker in their own processes; yields the client endpoint."""
    d = tempfile.mkdtemp(prefix="zb-")
    front, back = f"ipc://{d}/front", f"ipc://{d}/back"
    procs = [mp.Process(target=_forwarder, args=(front, back), daemon=True)]
    procs[0].start()
    time.sleep(0.2)
    procs.append(mp.Process(target=_echo_worker, args=(back,), daemon=True))
    procs[1].start()
    try:
        yield front
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
        for name in ("front", "back"):
            try:
                os.unlink(f"{d}/{name}")
            except FileNotFoundError:
                pass
        os.rmdir(d)


def process_cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of process ``pid``, to the nanosecond where the kernel says.

    ``/proc/PID/task/*/schedstat`` counts each thread's time on a CPU in ns; ``psutil``'s user+system figure
    moves in clock ticks (10 ms here), too coarse for a step of a second spread over three processes. Time of
    threads that ended is not counted (the measured processes keep theirs: ZeroMQ's I/O threads live as
    long as their context). Falls back to ``psutil`` where schedstat is missing.
    """
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return _psutil_cpu_s(pid)
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return total / 1e9


def _psutil_cpu_s(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return 0.0


def bare_latency_us(
    endpoint: str, frames: list[bytes], n: int, seconds: float | None = None, trips: Any = None
) -> list[float]:
    """Round-trip times in microseconds, one message in flight: ``n`` timed trips (after 50 warm-up trips),
    or fewer when ``seconds`` is given and runs out first. ``trips``: a shared counter (``.value``, e.g. a
    ``multiprocessing.Value``) counting every trip as it ends, warm-up trips included."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out = []
    deadline = None if seconds is None else time.perf_counter() + seconds
    try:
        for i in range(n + 50):
            if deadline is not None and i > 50 and i % 64 == 0 and time.perf_counter() > deadline:
                break
            t0 = time.perf_counter()
            sock.send_multipart(frames)
            if not sock.poll(5000):
                raise TimeoutError("bare round trip timed out")
            sock.recv_multipart()
            out.append((time.perf_counter() - t0) * 1e6)
            if trips is not None:
                trips.value += 1
    finally:
        sock.close()
    return out[50:]


def bare_rate(endpoint: str, frames: list[bytes], n: int, window: int) -> float:
    """Messages per second with ``window`` in flight (pipelined)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sent = received = 0
        t0 = time.perf_counter()
        while received < n:
            while sent < n and sent - received < window:
                sock.send_multipart(frames)
                sent += 1
            if not sock.poll(5000):
                raise TimeoutError("bare pipelined run timed out")
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                    received += 1
                except zmq.Again:
                    break
        return n / (time.perf_counter() - t0)
    finally:
        sock.close()


def shm_memcpy_s(nbytes: int, repeats: int = 10) -> float:
    """Best time to copy ``nbytes`` from a NumPy array into an already mapped /dev/shm segment."""
    from zinfer.client.shm import Segment

    seg = Segment.create(nbytes)
    try:
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.frombuffer(seg.buf, dtype=np.uint8, count=nbytes)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst[:] = src
            best = min(best, time.perf_counter() - t0)
        del dst
        return best
    finally:
        seg.close()
