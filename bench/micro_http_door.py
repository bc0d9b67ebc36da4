"""The HTTP door's own Python work per request, in one process: its connections (``HttpWire``) and handler
(``HttpFrontDoor``) on in-memory transports, fed the request tritonclient's HTTP client (and perf_analyzer)
sends for ``add0`` (two FP32 [1, 1] inputs as binary data, the output asked as binary data), CONCURRENCY
connections each sending its next request when its answer is written. No sockets and no HTTP client: what is
left is the door's parsing, routing, decoding, bridge and encoding, and the event loop under them.

``--shortcut`` answers from a recorded reply (``ZINFER_FRONTDOOR_SHORTCUT``): the door alone; without it
every request goes to a real broker (``zinfer serve`` on ``add0``) and the figure includes the bridge's
ZeroMQ hop on the door's side (its send, its receive, libzmq's I/O thread). Prints the door process's CPU
per request (its whole CPU time, all threads) and the requests per second, per event loop asked for.

``--threads`` adds each thread's CPU per request over the same window (the loop's thread, libzmq's I/O thread:
the kernel's per-thread counters); ``--callbacks`` (``asyncio`` loop only: uvloop's callbacks cannot be
hooked) adds the loop's CPU per request by callback (a task's steps under its coroutine's name, the selector's
waits as ``<select>``) and how many of each per request: what the door does per request, and how many turns
of the loop it takes.

Usage: ``.venv/bin/python bench/micro_http_door.py [--shortcut] [--loops asyncio,uvloop] [--requests N]
[--rounds R]``; ``LOOP@DIR`` runs another tree's door (a symlink tree ``DIR/zinfer/{client,...}``).
Compare rows of one run (the variants in turns within each round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_triton_repo  # noqa: E402
import zinfer_side  # noqa: E402

JSON = (
    b'{"inputs":[{"name":"INPUT_A","shape":[1,1],"datatype":"FP32","parameters":{"binary_data_size":4}},'
    b'{"name":"INPUT_B","shape":[1,1],"datatype":"FP32","parameters":{"binary_data_size":4}}],'
    b'"outputs":[{"name":"OUTPUT_SUM","parameters":{"binary_data":true}}]}'
)


def request_bytes(model: str) -> bytes:
    body = JSON + b"\x00\x00\x80?" + b"\x00\x00\x00@"
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
        f"Inference-Header-Content-Length: {len(JSON)}\r\nContent-Type: application/octet-stream\r\n"
        f"Accept: */*\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class MemoryTransport(asyncio.Transport):
    """One connection's transport: what the door writes is counted, then the next request is fed."""

    def __init__(self, on_answer: Any) -> None:
        super().__init__()
        self._on_answer = on_answer
        self._reading = True
        self._closing = False
        self.answers: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        self._reading = True

    def write(self, data: Any) -> None:
        if not self.answers:
            self.answers.append(bytes(data))
        self._on_answer()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True


async def drive(url: str, model: str, concurrency: int, requests: int) -> dict[str, Any]:
    from zinfer.client.gc_tuning import tune_for_serving
    from zinfer.frontdoor.bridge import Bridge
    from zinfer.frontdoor.door import FrontDoor, FrontDoorOptions
    from zinfer.frontdoor.http_server import HttpFrontDoor
    from zinfer.frontdoor.http_wire import HttpWire
    from zinfer.frontdoor.sysshm import SystemShm

    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="zmh-") as tmp:
        door = FrontDoor(FrontDoorOptions(url, Path(tmp) / "shm"), Bridge(url), SystemShm(Path(tmp) / "shm"))
        handler = HttpFrontDoor(door)
        tune_for_serving()  # as the door process, once set up (gc_tuning)
        req = request_bytes(model)
        total = requests + concurrency  # the first answer of each connection is a warm-up
        issued = counted = 0
        done = loop.create_future()
        t0 = c0 = 0.0
        th0: dict[str, float] = {}
        wires = []

        def connection() -> None:
            # a tree whose handler takes requests without a coroutine (``HttpFrontDoor.start``) is given it,
            # as ``serve_http`` does
            start = {"start": handler.start} if hasattr(handler, "start") else {}
            wire = HttpWire(handler.handle, handler.body_limit, lambda w: None, **start)

            def answered() -> None:
                nonlocal issued, counted, t0, c0
                counted += 1
                if counted == concurrency:
                    t0, c0 = time.monotonic(), time.process_time()
                    th0.update(thread_cpu() if THREADS[0] else {})
                    TALLY.clear()
                if issued < total:
                    issued += 1
                    loop.call_soon(wire.data_received, req)
                elif counted == total and not done.done():
                    done.set_result(None)

            transport = MemoryTransport(answered)
            wire.connection_made(transport)
            wires.append((wire, transport))
            wire.data_received(req)

        for _ in range(concurrency):
            connection()
        issued = concurrency
        await asyncio.wait_for(done, 300)
        t1, c1 = time.monotonic(), time.process_time()
        th1, tally = (thread_cpu() if th0 else {}), dict(TALLY)
        answer = wires[0][1].answers[0]
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        for wire, _ in wires:
            wire.connection_lost(None)
        await door.bridge.close()
        n = counted - concurrency
        fig: dict[str, Any] = {
            "per_s": round(n / (t1 - t0), 1),
            "cpu_us_per_request": round(1e6 * (c1 - c0) / n, 1),
        }
        if th0:
            fig["threads_us_per_request"] = {k: round((v - th0.get(k, 0.0)) / n, 1) for k, v in th1.items()}
        if tally:
            fig["callbacks"] = {
                k: {"us_per_request": round(1e6 * v[0] / n, 1), "per_request": round(v[1] / n, 2)}
                for k, v in sorted(tally.items(), key=lambda kv: -kv[1][0])
                if v[0] * 1e6 / n >= 0.5
            }
        return fig


THREADS = [False]  # ``--threads``: each thread's CPU is read at the window's ends
TALLY: dict[str, list[float]] = {}  # callback: [thread CPU seconds, calls] (``--callbacks``)


def thread_cpu() -> dict[str, float]:
    """Each thread of this process (``TID:name``) and its CPU time in µs (the kernel's schedstat, in ns)."""
    out: dict[str, float] = {}
    task = Path("/proc/self/task")
    for tid in os.listdir(task):
        try:
            name = (task / tid / "comm").read_text().strip()
            out[f"{tid}:{name}"] = int((task / tid / "schedstat").read_text().split()[0]) / 1e3
        except (OSError, ValueError, IndexError):
            continue
    return out


def hook_callbacks() -> None:
    """Time every callback the ``asyncio`` loop runs (thread CPU) under its name, and each selector wait."""
    import asyncio.events
    import selectors

    clock = time.thread_time
    run_handle = asyncio.events.Handle._run
    select = selectors.EpollSelector.select

    def add(name: str, spent: float) -> None:
        entry = TALLY.setdefault(name, [0.0, 0])
        entry[0] += spent
        entry[1] += 1

    def timed_run(self: Any) -> None:
        start = clock()
        run_handle(self)
        cb = self._callback
        owner = getattr(cb, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            name = "task " + str(getattr(coro, "__qualname__", coro))
        else:
            name = str(getattr(cb, "__qualname__", cb))
        add(name, clock() - start)

    def timed_select(self: Any, timeout: float | None = None) -> Any:
        start = clock()
        ready = select(self, timeout)
        add("<select>", clock() - start)
        return ready

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    selectors.EpollSelector.select = timed_select  # type: ignore[method-assign]


def run(loop_name: str, url: str, model: str, concurrency: int, requests: int) -> dict[str, Any]:
    factory = None
    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(drive(url, model, concurrency, requests))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shortcut", action="store_true", help="answer from a recorded reply (no broker hop)")
    ap.add_argument("--loops", default="asyncio,uvloop")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results", type=Path, help="also write every round's figures here (JSON)")
    ap.add_argument("--threads", action="store_true", help="each thread's CPU per request")
    ap.add_argument("--callbacks", action="store_true", help="the asyncio loop's CPU per request by callback")
    ap.add_argument("--child", nargs=2, metavar=("LOOP", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.shortcut:
            os.environ["ZINFER_FRONTDOOR_SHORTCUT"] = "1"
        if args.callbacks:
            if args.child[0] != "asyncio":
                ap.error("--callbacks times the asyncio loop's callbacks: use --loops asyncio")
            hook_callbacks()
        THREADS[0] = args.threads
        print(json.dumps(run(args.child[0], args.child[1], "add0", args.concurrency, args.requests)))
        return 0
    import subprocess

    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zmh-repo-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=True)
        with zinfer_side.serve(repo) as server:
            for r in range(args.rounds):
                loops = args.loops.split(",")
                for name in loops if r % 2 == 0 else loops[::-1]:
                    loop_name, _, tree = name.partition("@")  # LOOP@DIR: another tree's code (PYTHONPATH)
                    env = dict(os.environ, PYTHONPATH=tree) if tree else None
                    cmd = [sys.executable, __file__, "--child", loop_name, server.url, "--requests",
                           str(args.requests), "--concurrency", str(args.concurrency)]  # fmt: skip
                    cmd += [f for f, on in (("--shortcut", args.shortcut), ("--threads", args.threads),
                                            ("--callbacks", args.callbacks)) if on]  # fmt: skip
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                                         env=env)  # fmt: skip
                    try:
                        fig = json.loads(out.stdout.strip().splitlines()[-1])
                    except (ValueError, IndexError):
                        print(out.stdout[-800:], out.stderr[-2000:])
                        return 1
                    rows.setdefault(name, []).append(fig)
                    cpu = fig["cpu_us_per_request"]
                    print(f"round {r} {name:8s} {fig['per_s']:8.0f}/s  {cpu:6.1f} us/req", flush=True)
                    for part in ("threads_us_per_request", "callbacks"):
                        if part in fig:
                            print(f"    {part}: {json.dumps(fig[part])}", flush=True)
    if args.results:
        args.results.write_text(json.dumps({"argv": sys.argv[1:], "rounds": rows}, indent=1) + "\n")
    for name, figs in rows.items():
        cpu = statistics.median(f["cpu_us_per_request"] for f in figs)
        print(f"median {name:8s} {cpu:6.1f} us/req")
    return 0


if __name__ == "__main__":
    sys.exit(main())
