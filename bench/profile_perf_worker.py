"""Where a compiled worker's CPU goes: ``perf record`` (DWARF call stacks) of one model's worker process.

``profile_perf.py`` does this for the broker; this is the same summary for the worker of ``--model`` (the
load's model unless told, e.g. ``tokenizer`` under ``text_ensemble:32``): each sample under the innermost
compiled function on its stack ("(other thread)" when there is none: ZeroMQ's I/O thread, the heartbeat
thread, and on a build whose worker loop is interpreted, that loop), split by what ran (``python``,
``mypyc``, ``zmq``, ``msgspec``, ``kernel``, ``libc``), then the innermost symbols themselves.

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/profile_perf_worker.py add0:1 [--model M]
[--seconds 6] [--out F]`` (the load as in ``ab_turns.py``).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_perf as pp  # noqa: E402
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402


def worker_pid(server_pid: int, model: str) -> int:
    for c in psutil.Process(server_pid).children(recursive=True):
        cmd = c.cmdline()
        if "--model" in cmd and cmd[cmd.index("--model") + 1] == model:
            return c.pid
    raise SystemExit(f"no worker of model {model!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("load", help="MODEL:1 (one sync Client) or MODEL:N (one AsyncClient, N in flight)")
    ap.add_argument("--model", help="the worker to record (default: the load's model)")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=int, default=999, help="samples per second")
    ap.add_argument("--out", type=Path, help="also write the summary here")
    args = ap.parse_args()
    model, conc = args.load.split(":")[:2]
    with tempfile.TemporaryDirectory(prefix="zpw-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            run = "z.sync_latency(s, m, t, 10**7)"
            if conc != "1":
                run = f"z.async_closed(s, m, {int(conc)}, t, 10**7)"
            here = str(Path(__file__).resolve().parent)
            code = (
                f"import sys; sys.path.insert(0, {here!r}); import zinfer_side as z\n"
                f"s = z.ZinferServer({s.url!r}, {s.pid}); m, t = {model!r}, {args.seconds + 5}\n"
                f"print({run})"
            )
            load = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            time.sleep(3.0)  # warm up
            pid = worker_pid(s.pid, args.model or model)
            data = Path(tmp) / "perf.data"
            rec = ["perf", "record", "-F", str(args.rate), "--call-graph", "dwarf,16384", "-p", str(pid)]
            rec += ["-o", str(data), "--", "sleep", str(args.seconds)]
            subprocess.run(rec, capture_output=True, check=True)
            result = load.communicate(timeout=args.seconds + 120)[0].strip()
            samples = pp.stacks(data)
    name = args.model or model
    lines = [f"== worker of {name} under {args.load}, {args.seconds:g} s at {args.rate} Hz: {result}"]
    lines += pp.summarize(samples, 30)
    inner = collections.Counter(f"{s[0][0]} ({s[0][1]})" for s in samples if s)
    lines.append("  innermost symbols:")
    lines += [f"    {n / max(1, len(samples)):6.1%}  {name}" for name, n in inner.most_common(25)]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
