"""pyzmq's per-call cost, one process, the variants in turns: what ``client/zmq_calls.py`` keeps and why.

Each variant runs ``--calls`` times per turn, all variants in turn for ``--rounds`` rounds; the thread's CPU
time per call is printed (min, p25 and median of the rounds) beside an empty call. Variants:

* ``get(EVENTS)``: pyzmq's ``Socket.get`` (Cython; builds a ``SocketOption`` enum per call);
* ``ctypes EVENTS``: ``zmq_getsockopt`` of the same libzmq through ``ctypes.PyDLL`` (no enum, no GIL
  release), the socket's handle from ``Socket.underlying``;
* ``zmq_poll 0``: ``zmq.zmq_poll`` of the socket, timeout 0;
* ``recv EAGAIN``: a receive that finds nothing (the exception);
* ``send+2recv sugar`` / ``send+2recv cython``: one 64-byte frame from a DEALER to a ROUTER over inproc and
  its two frames received, the send through pyzmq's Python ``send`` or its Cython one (``zmq_calls.send``).

Usage: ``.venv/bin/python bench/micro_zmq_calls.py [--rounds 15] [--calls 20000]``
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable

import zmq

from zinfer.client import zmq_calls


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

    variants: dict[str, Callable[[], None]] = {
        "empty call": nothing, "get(EVENTS)": get, "ctypes EVENTS": by_ctypes, "zmq_poll 0": zpoll,
        "recv EAGAIN": again, "send+2recv sugar": sugar, "send+2recv cython": cython,
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
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
