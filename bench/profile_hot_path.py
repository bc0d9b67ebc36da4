"""py-spy profiles of every zinfer process under load: the client, the broker and the model's worker.

Two loads on the repository of ``bench_vs_triton.py``, each from a client process of its own (one
``AsyncClient``): the built-in ``add0`` (delay 0) with 128 requests in flight, and the Triton-style ``add``
at concurrency 32. For each, ``py-spy record`` samples the three processes at once for a bounded time; the
top frames (by own samples, and by samples that have the function anywhere on the stack) are written to a
text file, with each process's share of active samples (samples / (rate x seconds): about its CPU use).

Usage: ``.venv/bin/python bench/profile_hot_path.py OUT.txt [--seconds 8]`` (py-spy on PATH or in the venv).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402

RATE = 250  # samples per second
TOP = 25
LOADS = "add0:128,add:32"
WORKER_OF = {"text_ensemble": "tokenizer"}  # the worker profiled for a model that has none
SPY_FLAGS: list[str] = []  # py-spy record's own options (--gil, --native), from --spy
RAW_DIR: list[str] = []  # where py-spy's raw stacks are kept (--raw), if anywhere


def _py_spy() -> str:
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


def _worker_pid(broker: int, model: str) -> int:
    for c in psutil.Process(broker).children(recursive=True):
        args = c.cmdline()
        if "--model" in args and args[args.index("--model") + 1] == model:
            return c.pid
    raise RuntimeError(f"no worker of {model}")


WAITS = ("epoll_wait", "poll (", "select (", "ppoll", "pselect", "nanosleep", "pthread_cond")
"""Leaf frames of a native stack that are a thread asleep (py-spy --native counts those samples as active)."""


def summarize(raw: Path, seconds: float) -> list[str]:
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        if "--native" in SPY_FLAGS and frames[-1].startswith(WAITS):
            continue
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    out = [f"  active samples {total} ({total / (RATE * seconds):.0%} of one core's samples)"]
    out.append("  own samples (top):")
    out += [f"    {n / max(1, total):6.1%}  {f}" for f, n in own.most_common(TOP)]
    out.append("  on the stack (top):")
    out += [f"    {n / max(1, total):6.1%}  {f}" for f, n in incl.most_common(TOP)]
    return out


def profile(s: z.ZinferServer, model: str, conc: int, seconds: float, tmp: Path, client: str) -> list[str]:
    load = subprocess.Popen(
        [sys.executable, __file__, "--load", s.url, model, str(conc), str(seconds + 4), client],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(2.0)  # warm up
        worker = _worker_pid(s.pid, WORKER_OF.get(model, model))
        pids = {"client": load.pid, "broker": s.pid, "worker": worker}
        spies = {}
        for name, pid in pids.items():
            out = tmp / f"{model}-{name}.txt"
            cmd = [
                _py_spy(),
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(RATE),
                "--duration",
                str(int(seconds)),
            ]
            # native stacks need the process paused while they are read (py-spy refuses --nonblocking then)
            cmd += ["--format", "raw", "-o", str(out), *SPY_FLAGS]
            cmd += [] if "--native" in SPY_FLAGS else ["--nonblocking"]
            spies[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out)
        who = "one sync Client" if client == "sync" else "one AsyncClient"
        lines = [f"== {model}, {conc} in flight, {who}, {seconds:g} s at {RATE} Hz"]
        for name, (spy, out) in spies.items():
            _, err = spy.communicate(timeout=seconds + 60)
            lines.append(f"-- {name} (pid {pids[name]})")
            if spy.returncode != 0 or not out.exists():
                lines.append(f"  py-spy failed: {err.decode(errors='replace')[-500:]}")
                continue
            lines += summarize(out, seconds)
            if RAW_DIR:
                shutil.copy(out, Path(RAW_DIR[0]) / out.name)
        return lines
    finally:
        _, err = load.communicate(timeout=seconds + 60)
        if load.returncode != 0:
            print(err.decode(errors="replace")[-2000:], file=sys.stderr)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        url, model, conc, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        server = z.ZinferServer(url, os.getpid())
        if sys.argv[6] == "sync":
            r = z.sync_latency(server, model, seconds, 1_000_000)
        else:
            r = z.async_closed(server, model, conc, seconds, 1_000_000)
        print(r, file=sys.stderr)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument(
        "--loads",
        default=LOADS,
        help="model:in_flight[:sync],... (default %(default)s); ':sync': one sync Client, one in flight",
    )
    ap.add_argument(
        "--spy",
        default="",
        help="py-spy record options, comma-separated: 'gil' (only samples holding the GIL: Python's own "
        "work, not the waits a blocking call's samples may be counted in) and/or 'native' (C frames: a "
        "compiled build's functions)",
    )
    ap.add_argument("--raw", type=Path, help="a folder to keep py-spy's raw stacks in (MODEL-PROCESS.txt)")
    args = ap.parse_args()
    if args.raw:
        args.raw.mkdir(parents=True, exist_ok=True)
        RAW_DIR.append(str(args.raw))
    SPY_FLAGS.extend(f"--{f}" for f in args.spy.split(",") if f)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="zpp-") as tmp:
        repo = vs_triton_repo.write(Path(tmp) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            for load in args.loads.split(","):
                model, conc, *how = load.split(":")
                client = "sync" if how == ["sync"] else "async"
                in_flight = 1 if client == "sync" else int(conc)
                lines += profile(s, model, in_flight, args.seconds, Path(tmp), client)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
