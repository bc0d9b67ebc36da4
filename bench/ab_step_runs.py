"""A worker's own work per request of the three-step ensemble's steps as they arrive at c32 (a run of 8 for
``tokenizer`` and ``detokenizer``, a batch of 8 for ``lm``), without the socket, on two or more trees in
turns in one run: thread CPU per request of one EXECUTE as the worker runs it (its requests, the region
table, the cancel flags' new batch, ``request_batch.run_requests`` on the loaded Triton-style model) and its
RESULT encoded, best of 7 repetitions.

A tree is a folder that imports as ``zinfer`` on PYTHONPATH (a symlink tree of a checkout, or a compiled
build's path, as ``ab_turns`` takes). What it leaves out (the receive, the decode, the send, the wake-ups)
costs per message, not per request; under load it is several times its in-process cost (cold caches), see
``bench/results/ens-c32``.

Usage: ``.venv/bin/python bench/ab_step_runs.py A_DIR B_DIR [--rounds 3] [--n 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS = ("tokenizer", "lm", "detokenizer")


def _best_us(fn: Callable[[], object], n: int = 1500, reps: int = 7) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t) / n / 1e3)
    return best


def _step_us(name: str, repo: Path, runtime: Any, size: int) -> float:
    """Thread CPU per request of one EXECUTE of ``size`` requests of step ``name`` and its RESULT."""
    import numpy as np
    import vs_triton_repo

    from zinfer.client import dtypes, protocol
    from zinfer.client import worker_protocol as wp
    from zinfer.client.protocol import Command, OutputRequest, TensorRef
    from zinfer.modelconfig.autocomplete import complete_config
    from zinfer.modelconfig.repository import read_model_dir_config
    from zinfer.modelconfig.signature import Signature
    from zinfer.workers import request_batch
    from zinfer.workers.batch_io import BatchRequest
    from zinfer.workers.loader import load_model
    from zinfer.workers.regions import RegionCache

    config = complete_config(read_model_dir_config(repo / name), repo / name, 1)
    model = load_model(config, repo / name / "1", instance=0, threads=runtime.threads)
    sig, regions = Signature.of(config), RegionCache()
    if name == "tokenizer":
        data = dtypes.serialize_bytes(np.array([[vs_triton_repo.TEXT]], dtype=object))
        tensor, output = ("TEXT", "BYTES", (1, 1)), "TOKENS"
    else:
        n_tokens = len(vs_triton_repo.TEXT)
        data = np.arange(1, n_tokens + 1, dtype=np.int32).reshape(1, -1).tobytes()
        tensor, output = ("TOKENS", "INT32", (1, n_tokens)), "TOKENS_OUT" if name == "lm" else "TEXT"
    frames = [memoryview(data)] * size
    serial = name != "lm"  # the steps without dynamic batching get runs
    refs = [TensorRef(tensor[0], tensor[1], tensor[2], None, k) for k in range(size)]
    execute = wp.Execute(7, tuple(wp.ExecuteRequest(k + 1, (refs[k],), (OutputRequest(output),))
                                  for k in range(size)), serial=serial)  # fmt: skip

    def one() -> object:
        batch = [BatchRequest.from_broker(r) for r in execute.requests]
        regions.use_table(execute.regions)
        runtime.cancels.begin_batch(7, [r.id for r in batch])
        o = request_batch.run_requests(model, sig, batch, frames, regions, serial=serial,
                                       cancels=runtime.cancels)  # fmt: skip
        result = wp.WorkerResult(7, tuple(o.results), timings=(o.input_ns, o.infer_ns, o.output_ns))
        return protocol.encode(Command.W_RESULT, result, o.frames)

    return round(_best_us(one) / size, 3)


def child(size: int) -> None:
    sys.path.insert(0, str(HERE))
    import vs_triton_repo

    from zinfer.workers.runtime import WorkerRuntime, install

    runtime = WorkerRuntime()
    install(runtime)
    with tempfile.TemporaryDirectory(prefix="zab-steps-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=True)
        out = {name: _step_us(name, repo, runtime, size) for name in STEPS}
    print(json.dumps(out), flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=8, help="requests per EXECUTE")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b)):
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run([sys.executable, __file__, "--child", str(args.n)], env=env, cwd="/",
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{tree} failed:\n{done.stderr[-3000:]}")
            res = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(res)
            print(f"round {r} {name}: {json.dumps(res)}", flush=True)
    print(f"best of {args.rounds} rounds, us of thread CPU per request (A {args.a}, B {args.b})")
    best = {n: {s: min(x[s] for x in rs) for s in STEPS} for n, rs in runs.items()}
    for n, b in best.items():
        print(f"  {n}: " + "  ".join(f"{s} {v:.2f}" for s, v in b.items()) + f"  sum {sum(b.values()):.2f}")
    print("  B/A: " + "  ".join(f"{s} {best['B'][s] / best['A'][s]:.3f}" for s in STEPS)
          + f"  sum {sum(best['B'].values()) / sum(best['A'].values()):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
