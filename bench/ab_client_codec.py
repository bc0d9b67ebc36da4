"""The wire codec's per-request work at c32, two or more zinfer trees in turns in one run, without sockets:
thread CPU (``time.thread_time_ns``, best of 5 repetitions: other processes only ever add to it) of

* ``replies16``: a BUNDLE of 16 ``add`` REPLYs (one inline frame each, packed) read by ``decode_replies``,
  as the AsyncClient reads the broker's answers at c32; per reply;
* ``execute32``: a 32-request ``add`` EXECUTE (two inline [1,1] FP32 inputs each, packed) read by the
  worker's decoder (``decode_execute``, else ``protocol.decode`` and ``execute_from_wire``); per request;
* ``unpack64``: ``framing.unpack`` of that EXECUTE's 64 refs; per ref.

Each tree runs in a fresh process whose ``PYTHONPATH`` selects it (a symlink tree of a checkout, or a
compiled build: ``ab_compiled_ensemble --keep``), the trees alternating for ``--rounds`` rounds; the
summary is the best per tree and its ratio to the first tree.

Usage: ``python bench/ab_client_codec.py NAME=TREE NAME=TREE [--rounds 4] [--n 400]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import msgpack


def _best_ns(fn: Callable[[], object], n: int) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(5):
        t = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t) / n)
    return best


def child(n: int) -> dict[str, float]:
    from zinfer.client import framing, protocol
    from zinfer.client import worker_protocol as wp
    from zinfer.client.protocol import Command, OutputRequest, TensorRef

    body = {"model": "add", "version": 1,
            "outputs": [{"name": "OUTPUT_SUM", "datatype": "FP32", "shape": [1, 1], "frame": 0}]}  # fmt: skip
    items = [(Command.REPLY, {"id": f"{os.getpid()}-7f00aa-{i}", "status": 0, "body": body}, [b"\0" * 4])
             for i in range(16)]  # fmt: skip
    bundle = [bytes(memoryview(f)) for f in protocol.encode_bundle(items)]

    def inputs(i: int) -> tuple[TensorRef, ...]:
        return tuple(TensorRef(name, "FP32", (1, 1), None, 2 * i + k) for k, name in enumerate(("A", "B")))

    requests = tuple(wp.ExecuteRequest(i, inputs(i), (OutputRequest("OUTPUT_SUM"),)) for i in range(32))
    header = wp.execute_to_wire(wp.Execute(7, requests))
    execute = [bytes(memoryview(f)) for f in protocol.encode(Command.W_EXECUTE, header, [b"\0" * 4] * 64)]
    typed = getattr(wp, "decode_execute", None)

    def read_execute() -> object:
        msg = (typed(execute) if typed is not None else None) or protocol.decode(execute)
        return wp.execute_from_wire(msg.record_or_header)

    refs = msgpack.unpackb(execute[0][protocol.ENVELOPE_HEAD - 1 :])[0]  # as the packed envelope holds them
    return {
        "replies16_us_per_reply": _best_ns(lambda: protocol.decode_replies(bundle), n) / 16 / 1e3,
        "execute32_us_per_request": _best_ns(read_execute, n) / 32 / 1e3,
        "unpack64_us_per_ref": _best_ns(lambda: framing.unpack(refs, execute[1], [], 256), n) / 64 / 1e3,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("trees", nargs="+", help="NAME=TREE")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=400)
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.trees]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, path in trees:
            env = {**os.environ, "PYTHONPATH": path}
            out = subprocess.run([sys.executable, __file__, "--child", str(args.n)], env=env,
                                 capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
            runs[name].append(json.loads(out.stdout))
            print(f"round {r} {name}: {out.stdout.strip()}", flush=True)
    first = trees[0][0]
    best = {name: {k: min(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"best of {args.rounds} rounds")
    for name, row in best.items():
        ratios = {k: round(v / best[first][k], 3) for k, v in row.items()}
        print(name, {k: round(v, 3) for k, v in row.items()}, f"/ {first}:", ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
