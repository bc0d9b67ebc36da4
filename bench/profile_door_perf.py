"""Where a compiled broker's CPU goes under door traffic: ``perf record`` of the broker while perf_analyzer
runs ``add`` at 32 in flight through the HTTP (or gRPC) front door; the summary as ``profile_perf.py``'s
(each sample under the innermost compiled function on its stack, split by what the CPU ran).

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/profile_door_perf.py --triton-venv DIR
[--protocol http|grpc] [--seconds 6] [--rate 499] [--out F]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from bench_frontdoor import zinfer_front_door  # noqa: E402
from door_hop_shape import IN_FLIGHT, _broker_pid, _stats  # noqa: E402
from profile_perf import stacks, summarize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=int, default=499, help="samples per second")
    ap.add_argument("--out", type=Path, help="also write the summary here")
    ap.add_argument("--data", type=Path, help="keep perf's data here (for perf report / script)")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    if install is None:
        raise SystemExit(f"no Triton in {args.triton_venv}")
    pa = args.triton_venv / "bin" / "perf_analyzer"
    with tempfile.TemporaryDirectory(prefix="zpdf-") as tmp:
        (Path(tmp) / "env").mkdir()
        pa_env = triton_side._environment(install, Path(tmp) / "env")
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=True)
        with zinfer_front_door(repo, 1) as target:
            pid = _broker_pid(target)
            url = target.grpc if args.protocol == "grpc" else target.http
            window = str(int((args.seconds + 6) * 1000))
            cmd = [
                str(pa), "-m", "add", "-i", args.protocol, "-u", url, "--concurrency-range", str(IN_FLIGHT),
                "--measurement-interval", window, "--stability-percentage", "1000", "--max-trials", "1",
                "-b", "1", "--shape", "INPUT_A:1", "--shape", "INPUT_B:1",
            ]  # fmt: skip
            load = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=pa_env)
            time.sleep(3.0)  # warm up
            data = args.data or Path(tmp) / "perf.data"
            rec = ["perf", "record", "-F", str(args.rate), "--call-graph", "dwarf,16384", "-p", str(pid)]
            rec += ["-o", str(data), "--", "sleep", str(args.seconds)]
            before = _stats(target.broker_url)
            subprocess.run(rec, capture_output=True, check=True)
            after = _stats(target.broker_url)
            load.wait(timeout=args.seconds + 240)
            n, batches = after[0] - before[0], after[1] - before[1]
            samples = stacks(data)
            cpu_us = 1e6 * len(samples) / args.rate / max(1, n)
            lines = [
                f"== broker under {args.protocol} door c{IN_FLIGHT}, {args.seconds:g} s at {args.rate} Hz: "
                f"{n / args.seconds:.0f} requests/s, mean batch {n / max(1, batches):.1f}, "
                f"about {cpu_us:.1f} us of broker CPU per request (samples / rate / requests)"
            ]
            lines += summarize(samples, top=60)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
