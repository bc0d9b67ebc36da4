"""A worker's own work per EXECUTE of the three-step ensemble's step models, without the socket, on
mypyc-compiled builds of two or more trees, in turns in one run: thread CPU per EXECUTE of

* ``decode``: an EXECUTE's frames to its record (``decode_execute`` where the tree has it, else
  ``protocol.decode`` and ``execute_from_wire``);
* ``tokenizer``, ``lm``, ``detokenizer``: one request's EXECUTE run as the worker runs it (its requests, the
  cancel flags' new batch, ``request_batch.run_requests`` on the loaded Triton-style model) and its RESULT
  encoded as that tree's worker encodes it (its record as the header, or the map ``result_to_wire`` builds).

Each figure is the best of 5 repetitions of N calls in one process (``time.thread_time_ns``), and the
summary the best over the rounds: other processes on the machine only ever add to it (cache misses, lost
turns), so the least is the figure they disturbed least. What it leaves out (the socket, the wake-ups) is the
same code in the trees compared so far. The builds are as in
``ab_compiled_ensemble`` (``--keep`` reuses them).

Usage: ``.venv/bin/python bench/ab_worker_execute.py NAME=TREE NAME=TREE [--rounds 3] [--n 500]
[--keep DIR]``. Writes ``bench/results/ab_worker_execute.json``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_compiled_ensemble import build  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ab_worker_execute.json"
STEPS = ("tokenizer", "lm", "detokenizer")
TEXT = b"The quick brown fox jumps over the lazy dog"


def _best_us(fn: Callable[[int], object], n: int) -> float:
    for i in range(200):
        fn(i)
    best = float("inf")
    for rep in range(5):
        t = time.thread_time_ns()
        for i in range(n):
            fn(1000 + rep * n + i)
        best = min(best, (time.thread_time_ns() - t) / n / 1e3)
    return round(best, 2)


def _decode(n: int) -> float:
    from zinfer.client import protocol
    from zinfer.client import worker_protocol as wp
    from zinfer.client.protocol import Command, OutputRequest, TensorRef

    request = wp.ExecuteRequest(
        123456, (TensorRef("TEXT", "BYTES", (1, 1), None, 0),), (OutputRequest("T"),), "r"
    )
    header = wp.execute_to_wire(wp.Execute(7, (request,)))
    frames = [bytes(memoryview(f)) for f in protocol.encode(Command.W_EXECUTE, header, [b"x" * 47])]
    typed = getattr(wp, "decode_execute", None)

    def one(_: int) -> object:
        if typed is not None:
            msg = typed(frames) or protocol.decode(frames)
            return wp.execute_from_wire(msg.record_or_header)
        return wp.execute_from_wire(protocol.decode(frames).header)

    return _best_us(one, n * 40)


def _step(bench_dir: Path, model_name: str, n: int) -> float:
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

    with tempfile.TemporaryDirectory(prefix="zab-exec-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=True)
        config = complete_config(read_model_dir_config(repo / model_name), repo / model_name, 1)
        version_dir = repo / model_name / "1"
        kwargs: dict[str, Any] = {}
        try:  # a tree with a worker runtime: what the worker makes and passes on
            from zinfer.workers.runtime import WorkerRuntime, install

            runtime = WorkerRuntime()
            install(runtime)
            model = load_model(config, version_dir, instance=0, threads=runtime.threads)
            begin: Callable[[int, list[int]], None] = runtime.cancels.begin_batch
            kwargs["cancels"] = runtime.cancels
        except ImportError:  # an older tree: module-level cancel flags
            from zinfer.workers import cancel_flags  # type: ignore[attr-defined]

            model = load_model(config, version_dir)
            begin = cancel_flags.begin_batch
        sig = Signature.of(config)
        regions = RegionCache()
        if model_name == "tokenizer":
            data = dtypes.serialize_bytes(np.array([[TEXT]], dtype=object))
            tensor, out = TensorRef("TEXT", "BYTES", (1, 1), None, 0), "TOKENS"
        else:
            data = np.arange(1, len(TEXT) + 1, dtype=np.int32).reshape(1, -1).tobytes()
            tensor = TensorRef("TOKENS", "INT32", (1, len(TEXT)), None, 0)
            out = "TOKENS_OUT" if model_name == "lm" else "TEXT"
        frames = [memoryview(data)]
        # the RESULT as the tree's worker sends it: its record as the header, or the map result_to_wire builds
        from zinfer.workers.worker import Worker

        as_record = "result_to_wire(" not in inspect.getsource(Worker.send_result)

        def one(batch: int) -> object:
            execute = wp.Execute(batch, (wp.ExecuteRequest(1, (tensor,), (OutputRequest(out),)),))
            requests = [BatchRequest.from_broker(r) for r in execute.requests]
            regions.use_table(execute.regions)
            begin(batch, [r.id for r in requests])
            o = request_batch.run_requests(model, sig, requests, frames, regions, **kwargs)
            result = wp.WorkerResult(batch, tuple(o.results), timings=(o.input_ns, o.infer_ns, o.output_ns))
            header = result if as_record else wp.result_to_wire(result)
            return protocol.encode(Command.W_RESULT, header, o.frames)

        return _best_us(one, n)


def child(bench_dir: Path, n: int) -> None:
    sys.path.insert(0, str(bench_dir))
    out = {"decode": _decode(n), **{m: _step(bench_dir, m, n) for m in STEPS}}
    print(json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("trees", nargs="*", metavar="NAME=TREE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=500, help="EXECUTEs per repetition (decodes: 40 times more)")
    ap.add_argument("--keep", type=Path, help="keep the builds in DIR/NAME (and reuse them)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.n)
        return 0
    if len(args.trees) < 2:
        ap.error("give two trees or more, NAME=TREE each")
    trees = {n: Path(t).resolve() for n, t in (x.split("=", 1) for x in args.trees)}
    work = args.keep or Path(tempfile.mkdtemp(prefix="zab-build-"))
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
    try:
        built = {name: build(tree, work / name) for name, tree in trees.items()}
        for i in range(args.rounds):
            for name, path in built.items():
                env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(path)}
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    str(work / name / "src" / "bench"),
                    "--n",
                    str(args.n),
                ]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd="/")
                if done.returncode != 0:
                    raise SystemExit(f"{name} round {i + 1} failed:\n{done.stderr[-3000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                runs[name].append(r)
                print(f"round {i + 1} {name:>8}: " + "  ".join(f"{k} {v:6.2f}" for k, v in r.items()) + " us")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    keys = ("decode", *STEPS)
    best = {n: {k: round(min(r[k] for r in rs), 2) for k in keys} for n, rs in runs.items()}
    print("best over the rounds (us of thread CPU per EXECUTE):")
    for n, m in best.items():
        total = round(m["decode"] * 3 + sum(m[s] for s in STEPS), 1)
        print(f"  {n:>8}: " + "  ".join(f"{k} {v}" for k, v in m.items()) + f"  ensemble request {total}")
    doc = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trees": {n: str(t) for n, t in trees.items()},
        "rounds": args.rounds,
        "n": args.n,
        "best_us": best,
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
