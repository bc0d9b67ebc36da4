"""Does the worker's time per batch set zinfer's HTTP c32 rate? One zinfer server (front door on) with three
copies of ``vs_triton_repo``'s ``add`` model, the same config under three names, measured in turns with
perf_analyzer over HTTP at concurrency 32 (issue 33's HTTP c32 step):

* ``add``: the bench's model (``pb_utils`` inputs read, summed, one response each);
* ``add_fast``: the same responses' shape without the work: one constant response object returned for every
  request (the model's own ``execute`` about 60 us shorter per batch of 16, the ``pb_utils`` requests and
  the outputs as before);
* ``add_fast60``: ``add_fast`` plus a 60 us busy wait per batch, the time taken off put back.

If the worker's time per batch were what limits the rate, ``add_fast`` would be faster than the other two by
about as much as it saves. Each variant's rate per round and its ``Server Compute Infer`` (the worker's
execute per batch, as perf_analyzer reports it) are printed and written.

Usage: ``.venv/bin/python bench/model_cost_turns.py --triton-venv DIR [--rounds 4] [--label L]``
(``PYTHONPATH=TREE`` for another zinfer tree, e.g. a compiled build). Results:
bench/results/model_cost_turns.json (an entry per ``--label``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_serving import ROOT, record_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "model_cost_turns.json"

FAST = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("OUTPUT_SUM", np.ones((1, 1), np.float32))]
        )
        return [out] * len(requests)
"""

FAST60 = FAST.replace(
    "        return [out] * len(requests)",
    "        import time\n\n        t = time.perf_counter() + 60e-6\n        while time.perf_counter() < t:\n"
    "            pass\n        return [out] * len(requests)",
)

VARIANTS = ("add", "add_fast", "add_fast60")


def write_repo(root: Path) -> Path:
    repo = vs_triton_repo.write(root, zinfer_only=False)
    for name, source in (("add_fast", FAST), ("add_fast60", FAST60)):
        shutil.copytree(repo / "add", repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add"', f'name: "{name}"'))
        (repo / name / "1" / "model.py").write_text(source)
    return repo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True, help="tritonclient 2.51 (perf_analyzer)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--label", default="latest")
    args = ap.parse_args()
    pa = args.triton_venv / "bin" / "perf_analyzer"
    install = triton_side.find(args.triton_venv) or triton_side.TritonInstall(
        args.triton_venv, args.triton_venv / "bin" / "python", Path()
    )
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="zmc-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env").mkdir()
        env = triton_side._environment(install, tmp / "env")
        repo = write_repo(tmp / "models")
        with zinfer_front_door(repo, 1) as target:
            for k in range(args.rounds):
                order = VARIANTS if k % 2 == 0 else VARIANTS[::-1]  # the order alternates by round
                for name in order:
                    try:
                        fig = perf_analyzer(pa, env, target, "http", name, 32, ADD_SHAPES, 3000)
                    except (RuntimeError, subprocess.SubprocessError) as exc:
                        print(f"round {k} {name}: no figure ({str(exc)[:120]})")
                        continue
                    row = {
                        "throughput_s": fig["throughput_s"],
                        "compute_infer_us": fig.get("server_compute_infer_us"),
                    }
                    rows[name].append(row)
                    print(f"round {k} {name}: {row}", flush=True)
    medians = {
        name: {"throughput_s": statistics.median(r["throughput_s"] for r in got)}
        for name, got in rows.items()
        if got
    }
    for name, m in medians.items():
        print(f"{name}: median {m['throughput_s']:.0f}/s over {len(rows[name])} rounds")
    command = f"bench/model_cost_turns.py --triton-venv DIR --rounds {args.rounds} --label {args.label}"
    record_run(RESULTS, args.label, command, {"rows": rows, "medians": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
