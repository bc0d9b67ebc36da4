"""Where a compiled front door's CPU goes: ``perf record`` (DWARF call stacks) of the door process while
perf_analyzer sends to it (``add`` at concurrency 32 by default, over HTTP or gRPC).

py-spy sees no frames of mypyc-compiled code (the door's codec, records and the client's protocol run
compiled); ``perf`` samples CPU time only and unwinds through them. Each sample goes under the innermost
compiled function on its stack (``CPyDef_*``), else under the innermost interpreted frame's code object
name that perf can name, split by what the CPU ran (``profile_perf.summarize``: python, mypyc, zmq, msgspec,
kernel, libc); a second table counts each compiled function inclusively (anywhere on the stack).

With ``--ensemble`` the load is the seed's workload instead: ``bench_frontdoor_ensemble``'s client
(tritonclient.grpc.aio run by the Triton venv's python, 32 in flight on ``text_ensemble``) through the gRPC
door; ``--process worker`` then records the ``lm`` step's first worker.

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/profile_perf_door.py --triton-venv DIR
[--process door|broker|worker] [--protocol http] [--ensemble] [--seconds 5] [--out F]``.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import ADD_SHAPES, perf_analyzer, zinfer_front_door  # noqa: E402
from bench_frontdoor_ensemble import turn as ensemble_turn  # noqa: E402
from profile_perf import stacks, summarize  # noqa: E402


def inclusive(samples: list[list[tuple[str, str]]], top: int = 40) -> list[str]:
    """Each compiled function's share of the samples, callees included."""
    by: collections.Counter[str] = collections.Counter()
    for frames in samples:
        for name in {f for f, _ in frames if f.startswith(("CPyDef_", "CPyPy_"))}:
            by[name] += 1
    total = max(1, len(samples))
    return [f"    {n / total:6.1%}  {name}" for name, n in by.most_common(top)]


def by_thread(perf_data: Path) -> collections.Counter[str]:
    """Samples per thread name (the loop's thread is named after the process, ZeroMQ's I/O ``ZMQbg/IO/0``)."""
    out = subprocess.run(["perf", "script", "-F", "comm", "-i", str(perf_data)], capture_output=True,
                         text=True).stdout  # fmt: skip
    return collections.Counter(line.strip() for line in out.splitlines() if line.strip())


def _pid_of(process: str, door_pid: int, model: str = "add") -> int:
    """The door's pid, its parent's (the broker) or the broker's child running ``model``'s worker."""
    if process == "door":
        return door_pid
    broker = psutil.Process(door_pid).parent()
    assert broker is not None
    if process == "broker":
        return broker.pid
    workers = [p for p in broker.children(recursive=True) if "worker" in " ".join(p.cmdline())
               and model in p.cmdline()]  # fmt: skip
    return workers[0].pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--protocol", default="http")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=499, help="samples per second")
    ap.add_argument("--out", type=Path, help="also write the summary here")
    ap.add_argument("--ensemble", action="store_true", help="the seed's ensemble client over gRPC instead")
    ap.add_argument(
        "--process", choices=("door", "broker", "worker"), default="door",
        help="the process recorded: the door, the broker (its parent) or add's worker",
    )  # fmt: skip
    args = ap.parse_args()
    pa = args.triton_venv / "bin" / "perf_analyzer"
    install = triton_side.find(args.triton_venv) or triton_side.TritonInstall(
        args.triton_venv, args.triton_venv / "bin" / "python", Path()
    )
    with tempfile.TemporaryDirectory(prefix="zpd-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env").mkdir()
        env = triton_side._environment(install, tmp / "env")
        repo = vs_triton_repo.write(tmp / "models", zinfer_only=False)
        with zinfer_front_door(repo, 1) as target:
            assert target.door_pid is not None
            result: dict[str, Any] = {}

            def load() -> None:
                if args.ensemble:  # the client runs 2 s before and after the recording
                    broker_pid = psutil.Process(target.door_pid or 0).ppid()
                    seconds = args.seconds + 4.0
                    result["pa"] = ensemble_turn(install.python, target.grpc, seconds, broker_pid, "zinfer")
                    return
                result["pa"] = perf_analyzer(
                    pa, env, target, args.protocol, "add", args.concurrency, ADD_SHAPES, 1500
                )

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            time.sleep(2.0)
            data = tmp / "perf.data"
            pid = _pid_of(args.process, target.door_pid, "lm" if args.ensemble else "add")
            rec = ["perf", "record", "-F", str(args.rate), "--call-graph", "dwarf,16384", "-p",
                   str(pid), "-o", str(data), "--", "sleep", str(args.seconds)]  # fmt: skip
            subprocess.run(rec, capture_output=True, check=True)
            thread.join(300)
            samples = stacks(data)
            threads = by_thread(data)
    fig = result.get("pa", {})
    load = "the ensemble client over grpc" if args.ensemble else f"perf_analyzer {args.protocol} add"
    cpu = fig.get("server_cpu_us_per_request", {}).get("door") if args.ensemble else (
        fig.get("door_cpu_us_per_request", "-"))  # fmt: skip
    lines = [
        f"== {args.process} under {load} c{args.concurrency}, {args.seconds:g} s: "
        f"{fig.get('throughput_s', 0):.0f}/s door cpu {cpu} us/req"
    ]
    total = max(1, sum(threads.values()))
    lines += ["  samples by thread: " + ", ".join(f"{k} {v / total:.1%}" for k, v in threads.most_common())]
    lines += summarize(samples)
    lines += ["  inclusive (compiled functions anywhere on the stack):", *inclusive(samples)]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
