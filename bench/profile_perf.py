"""Where a compiled broker's CPU goes: ``perf record`` (DWARF call stacks) of the broker under one load (or of
the client, or of every worker process: ``--process``).

py-spy sees no frames of mypyc-compiled code, and on this kind of machine counts a thread asleep in
``epoll_wait`` or ``select`` as active; ``perf`` samples only CPU time and unwinds through the compiled
functions. Each sample is put under the innermost compiled function on its stack (``CPyDef_*``; "(other
thread)" for ZeroMQ's I/O thread and the metrics server's), split by what the CPU was running at that
moment: the interpreter (``python``: interpreted modules, dataclass ``__init__``s, enum lookups), compiled
code (``mypyc``), ``zmq``, ``msgspec``, ``kernel`` or ``libc``.

Usage: ``PYTHONPATH=COMPILED_TREE .venv/bin/python bench/profile_perf.py add0:1
[--process broker|client|workers] [--seconds 5] [--out F]``
(the load as in ``ab_turns.py``: ``MODEL:1`` one sync Client, ``MODEL:N`` one AsyncClient with N in flight).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_triton_repo  # noqa: E402
import zinfer_side as z  # noqa: E402

_FRAME = re.compile(r"[0-9a-f]+ (\S+?)(\+0x[0-9a-f]+)? \((.*)\)$")
_KINDS = (
    ("kernel", "kernel"), ("libpython", "python"), ("zmq", "zmq"), ("mypyc", "mypyc"), ("_core", "msgspec"),
)  # fmt: skip


def stacks(perf_data: Path) -> list[list[tuple[str, str]]]:
    """Each sample's frames, innermost first, as (symbol, library)."""
    text = subprocess.run(["perf", "script", "-i", str(perf_data)], capture_output=True, text=True).stdout
    out: list[list[tuple[str, str]]] = []
    cur: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if cur:
                out.append(cur)
            cur = []
            continue
        m = _FRAME.match(line)
        if m:
            cur.append((m.group(1), m.group(3).rsplit("/", 1)[-1]))
    if cur:
        out.append(cur)
    return out


def summarize(samples: list[list[tuple[str, str]]], top: int = 40) -> list[str]:
    by: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[tuple[str, str]] = collections.Counter()
    for frames in samples:
        compiled = next((f for f, _ in frames if f.startswith("CPyDef_")), None)
        if compiled is None:
            main = any("Broker___run" in f or "main_loop" in f for f, _ in frames)
            compiled = "(main thread, outside compiled code)" if main else "(other thread)"
        lib = frames[0][1]
        kind = next((k for key, k in _KINDS if key in lib), "libc" if "libc" in lib else lib)
        by[compiled] += 1
        kinds[(compiled, kind)] += 1
    total = max(1, len(samples))
    lines = [f"  {len(samples)} samples; under the innermost compiled function [what ran]:"]
    for name, n in by.most_common(top):
        split = ", ".join(f"{k} {c}" for (f, k), c in kinds.most_common() if f == name)
        lines.append(f"    {n / total:6.1%}  {name}  [{split}]")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("load", help="MODEL:1 (one sync Client) or MODEL:N (one AsyncClient, N in flight)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=499, help="samples per second")
    ap.add_argument("--out", type=Path, help="also write the summary here")
    ap.add_argument("--process", choices=("broker", "client", "workers"), default="broker", help="recorded")
    args = ap.parse_args()
    model, conc = args.load.split(":")[:2]
    with tempfile.TemporaryDirectory(prefix="zpf-") as tmp:
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
            data = Path(tmp) / "perf.data"
            rec = ["perf", "record", "-F", str(args.rate), "--call-graph", "dwarf,16384", "-p"]
            pids = {"broker": [s.pid], "client": [load.pid]}.get(args.process)
            if pids is None:  # every worker process of the server
                pids = [p.pid for p in psutil.Process(s.pid).children(recursive=True)]
            rec += [",".join(map(str, pids))]
            rec += ["-o", str(data), "--", "sleep", str(args.seconds)]
            subprocess.run(rec, capture_output=True, check=True)
            result = load.communicate(timeout=args.seconds + 120)[0].strip()
            lines = [f"== {args.process} under {args.load}, {args.seconds:g} s at {args.rate} Hz: {result}"]
            lines += summarize(stacks(data))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
