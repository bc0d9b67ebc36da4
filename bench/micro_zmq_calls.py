"""pyzmq's per-call cost, one process, the variants in turns: what ``client/zmq_calls.py`` keeps and why.

Each variant runs ``--calls`` times per turn, all variants in turn for ``--rounds`` rounds; the thread's CPU
time per call is printed (min, p25 and median of the rounds) beside an empty call. Variants:

* ``get(EVENTS)``: pyzmq's ``Socket.get`` (Cython; builds a ``SocketOption`` enum per call);
* ``ctypes EVENTS``: ``zmq_getsockopt`` of the same libzmq through ``ctypes.PyDLL`` (no enum, no GIL
  release), the socket's handle from ``Socket.underlying``;
* ``zmq_poll 0``: ``zmq.zmq_poll`` of the socket, timeout 0;
* ``recv EAGAIN``: a receive that finds nothing (the exception);
* ``send+2recv sugar`` / ``send+2recv cython``: one 64-byte frame from a DEALER to a ROUTER over inproc and
  its two frames received, the send through pyzmq's Python ``send`` or its Cython one (``zmq_calls.send``);
* ``link poll EVENTS`` / ``link poll fd-gated``: the sync client's per-request look at its socket monitor
  (``LinkWatch.poll``), asking ``EVENTS`` as before or only when the monitor's descriptor is readable;
* ``server check lstat`` / ``server check gated``: the per-request check of the server's socket file as
  before (``paths.check_server_socket``, one ``lstat``) or ``ServerCheck.check_changed`` (a link poll).

Usage: ``.venv/bin/python bench/micro_zmq_calls.py [--rounds 15] [--calls 20000]``
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from zinfer.client import paths, zmq_calls
from zinfer.client.link_watch import LinkWatch
from zinfer.client.server_check import ServerCheck


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.ROUTER)
    b.bind("inproc://micro")
    a.connect("inproc://micro")
    ev, noblock = int(zmq.EVENTS), int(zmq.NOBLOCK)
    path = next(line.split()[-1] for line in open("/proc/self/maps") if "libzmq" in line)
    raw = ctypes.PyDLL(path)["zmq_getsockopt"]
    val, size = ctypes.c_int(), ctypes.c_size_t(4)
    pval, psize = ctypes.byref(val), ctypes.byref(size)
    msg = b"y" * 64
    send = zmq_calls.send
    with tempfile.TemporaryDirectory() as tmp:
        return _run(args, ctx, a, b, ev, noblock, raw, pval, psize, msg, send, Path(tmp) / "s.sock")


def _run(args: Any, ctx: Any, a: Any, b: Any, ev: int, noblock: int, raw: Any, pval: Any, psize: Any,
         msg: bytes, send: Any, sock_path: Path) -> int:  # fmt: skip
    server = ctx.socket(zmq.ROUTER)
    server.bind(f"ipc://{sock_path}")
    client = zmq.Context.instance().socket(zmq.DEALER)
    link = LinkWatch(client, f"ipc://{sock_path}", lambda exc: None)
    client.connect(f"ipc://{sock_path}")
    check = ServerCheck(str(sock_path), None, link)
    deadline = time.monotonic() + 10
    while link.changes < 1 and time.monotonic() < deadline:  # connected
        link.poll()
        time.sleep(0.001)
    check.check()
    seen = paths.check_server_socket(str(sock_path))

    def nothing() -> None:
        pass

    def get() -> None:
        a.get(ev)

    def by_ctypes() -> None:
        if a.closed or raw(ctypes.c_void_p(a.underlying), ev, pval, psize):
            a.get(ev)

    def zpoll() -> None:
        zmq.zmq_poll([(a, zmq.POLLIN)], 0)

    def again() -> None:
        try:
            b.recv(noblock, copy=False)
        except zmq.Again:
            pass

    def sugar() -> None:
        a.send(msg, 0, copy=True)
        b.recv(0, copy=False)
        b.recv(0, copy=False)

    def cython() -> None:
        send(a, msg, 0, True)
        b.recv(0, copy=False)
        b.recv(0, copy=False)

    def link_events() -> None:
        link._look = True  # as before: EVENTS asked whatever the descriptor says
        link.poll()

    def lstat() -> None:
        paths.check_server_socket(str(sock_path), None, seen)

    variants: dict[str, Callable[[], None]] = {
        "empty call": nothing, "get(EVENTS)": get, "ctypes EVENTS": by_ctypes, "zmq_poll 0": zpoll,
        "recv EAGAIN": again, "send+2recv sugar": sugar, "send+2recv cython": cython,
        "link poll EVENTS": link_events, "link poll fd-gated": link.poll, "server check lstat": lstat,
        "server check gated": check.check_changed,
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t0 = time.thread_time_ns()
            for _ in range(args.calls):
                fn()
            times[name].append((time.thread_time_ns() - t0) / args.calls / 1000)
    print(f"{'us per call (thread CPU)':<24} {'min':>7} {'p25':>7} {'median':>7}")
    for name, t in times.items():
        t.sort()
        print(f"{name:<24} {t[0]:7.3f} {t[len(t) // 4]:7.3f} {t[len(t) // 2]:7.3f}")
    link.close()
    for sock in (a, b, server, client):
        sock.close(linger=0)
    ctx.term()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
