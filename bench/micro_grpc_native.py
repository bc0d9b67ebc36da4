"""pygrpc-native's server alone, answering an echo method: its CPU per call, by thread, and the time inside
``respond``, under unary load from a grpcio client process (``--concurrency`` calls in flight).

Variants, to run in turns: ``--server stock`` (pygrpc-native's own aio server) or ``lean``
(``frontdoor/grpc_native.py``'s LeanServer), ``--io-threads N`` (pygrpc-native's I/O threads). The server's
CPU per call is its process time over the calls answered; by thread: the event loop's thread, pygrpc-native's
dispatch thread (a Python thread) and its I/O threads (Rust), from the kernel's per-thread counters.

Usage: ``.venv/bin/python bench/micro_grpc_native.py --server lean --io-threads 1 [--concurrency 32]
[--seconds 5]``. Prints one line per run; nothing is written. A loaded machine moves every figure: compare
runs in turns.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROOT  # noqa: E402

CLIENT = r"""
import asyncio, sys, time, grpc
async def main(port, seconds, concurrency):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.unary_unary("/bench.Echo/Echo")
        end = time.monotonic() + seconds
        async def one():
            while time.monotonic() < end:
                await method(b"y" * 64, timeout=30)
        await asyncio.gather(*[one() for _ in range(concurrency)])
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
"""


async def _echo(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(0)
    return request


def _by_thread(dispatch: set[int]) -> dict[str, float]:
    """CPU seconds of this process's threads: main (the loop), dispatch, and the rest by name."""
    rows: dict[str, float] = {}
    for task in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            name = Path(task, "comm").read_text().strip()
            fields = Path(task, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tid = int(task.rsplit("/", 1)[1])
        name = "loop" if tid == os.getpid() else "dispatch" if tid in dispatch else name
        rows[name] = rows.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rows


async def run(server_kind: str, io_threads: int, concurrency: int, seconds: float) -> None:
    paio: Any = importlib.import_module("pygrpc_native.aio")
    if server_kind == "lean":
        sys.path.insert(0, str(ROOT))
        grpc_native: Any = importlib.import_module("zinfer.frontdoor.grpc_native")
        server = grpc_native._lean_class(paio)(options=[], io_threads=io_threads)
        server._lean_paths = frozenset({"/bench.Echo/Echo"})
    else:
        server = paio.Server(options=[], io_threads=io_threads)
    server.add_registered_method_handlers("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)})
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    front = server._front
    respond = front.respond
    inside = [0, 0, 0]  # calls, wall ns, thread CPU ns

    class Timed:
        def __getattr__(self, name: str) -> Any:
            return getattr(front, name)

        def respond(self, *args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            out = respond(*args, **kwargs)
            inside[0] += 1
            inside[1] += time.perf_counter_ns() - wall
            inside[2] += time.thread_time_ns() - cpu
            return out

    server._front = Timed()
    dispatch = {t.native_id for t in threading.enumerate() if "dispatch" in t.name and t.native_id}
    before, cpu0, wall0 = _by_thread(dispatch), time.process_time(), time.monotonic()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, str(port), str(seconds), str(concurrency)
    )
    await client.wait()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    after = _by_thread(dispatch)
    n = max(inside[0], 1)
    threads = {k: round((v - before.get(k, 0.0)) / n * 1e6, 1) for k, v in sorted(after.items())}
    print(
        f"server={server_kind} io_threads={io_threads} c={concurrency} calls={inside[0]} "
        f"rate={inside[0] / wall:.0f}/s cpu/call={cpu / n * 1e6:.1f}us "
        f"respond wall={inside[1] / n / 1e3:.1f}us "
        f"cpu={inside[2] / n / 1e3:.1f}us by thread us/call {threads}",
        flush=True,
    )
    server._front = front
    await server.stop(None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=("stock", "lean"), default="lean")
    ap.add_argument("--io-threads", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    try:
        uvloop: Any = importlib.import_module("uvloop")
        uvloop.run(run(args.server, args.io_threads, args.concurrency, args.seconds))
    except ImportError:
        asyncio.run(run(args.server, args.io_threads, args.concurrency, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
