"""The pieces of a worker's EXECUTE that the ens-worker changes touched, on two or more trees in turns in one
run (pure Python, each turn a fresh child process): thread CPU per call, best of 7 repetitions, of

* ``input_array frame``: one INT32 [1, 43] input over an inline frame (a memoryview, as ``recv_buffers``
  gives);
* ``input_array region``: the same over a range of a server segment (``RegionCache``);
* ``emit frame``: one INT32 [1, 43] output as an inline frame;
* ``from_broker``: an EXECUTE's request as the runner's ``BatchRequest``;
* ``open_inputs``: a one-request batch's arrays and ``RequestInputs`` (the lm step's).

Usage: ``.venv/bin/python bench/ab_worker_pieces.py NAME=TREE NAME=TREE [--rounds 3]`` (a TREE is a folder
that imports as ``zinfer`` on PYTHONPATH, as ab_turns takes). Prints one line per turn and the best per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable


def _tt(fn: Callable[[], object], n: int = 20000, reps: int = 7) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t) / n)
    return round(best / 1e3, 3)


def child() -> None:
    import numpy as np

    from zinfer.client import worker_protocol as wp
    from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
    from zinfer.client.shm import Segment
    from zinfer.modelconfig.model_config import parse_model_config
    from zinfer.modelconfig.signature import Signature
    from zinfer.workers import request_batch as rb
    from zinfer.workers.batch_io import BatchRequest, emit, input_array
    from zinfer.workers.cancel_flags import CancelFlags
    from zinfer.workers.regions import RegionCache

    n = 43
    frame = memoryview(np.arange(n, dtype=np.int32).tobytes())
    ref = TensorRef("TOKENS", "INT32", (1, n), None, 0)
    seg = Segment.create(4096)
    regions = RegionCache()
    sref = TensorRef("TOKENS", "INT32", (1, n), ShmRef(seg.name, 64, n * 4))
    out = np.arange(n, dtype=np.int32).reshape(1, -1)
    er = wp.ExecuteRequest(1, (ref,), (OutputRequest("TOKENS_OUT"),), "r")
    text = (
        'name: "lm"\nbackend: "python"\nmax_batch_size: 16\n'
        'input [ { name: "TOKENS" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "TOKENS_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    )
    sig = Signature.of(parse_model_config(text, source="bench", model_name="lm"))
    cancels = CancelFlags()
    cancels.begin_batch(1, [1])
    reqs = [BatchRequest.from_broker(er)]
    try:
        r = {
            "input_array frame": _tt(lambda: input_array(ref, [frame], regions)),
            "input_array region": _tt(lambda: input_array(sref, [], regions)),
            "emit frame": _tt(lambda: emit("TOKENS_OUT", out, None, "INT32", regions, [])),
            "from_broker": _tt(lambda: BatchRequest.from_broker(er)),
            "open_inputs": _tt(
                lambda: rb.open_inputs(sig, reqs, [frame], regions, None, cancels, rb.BatchOutcome())
            ),
        }
    finally:
        regions.close()
        seg.close(unlink=True)
    print(json.dumps(r), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("trees", nargs="*", metavar="NAME=TREE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    if len(args.trees) < 2:
        ap.error("give two trees or more, NAME=TREE each")
    trees = dict(t.split("=", 1) for t in args.trees)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree}
            cmd = [sys.executable, __file__, "--child"]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(r)
            print(f"round {i + 1} {name:>8}: " + "  ".join(f"{k} {v:6.3f}" for k, v in r.items()) + " us")
    print("best over the rounds (us of thread CPU per call):")
    for name, rs in runs.items():
        print(f"  {name:>8}: " + "  ".join(f"{k} {min(r[k] for r in rs):.3f}" for k in rs[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
