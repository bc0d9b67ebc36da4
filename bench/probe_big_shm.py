"""What a 4 MiB tensor in system shared memory costs the front door to copy, beside the raw limit.

In one process, in turns (round after round, each way once per round), this thread's CPU time per call
(``time.thread_time``: what the call costs, whatever else the shared cores run) of:

* the raw limits: a ``memcpy`` of 4 MiB between two mapped ``/dev/shm`` files (``np.copyto``), ``preadv``
  of 4 MiB from a ``/dev/shm`` file into mapped memory, ``pwrite`` of 4 MiB from mapped memory into one;
* the front door's own calls on a registered region (``SystemShm.read`` into a mapped arena-like buffer,
  ``SystemShm.write`` from one): through the segment's mapping with the guarded copy (``_shmcopy``, where
  it is built) and through ``pread``/``pwrite`` (the helper left out), with every check they make.

Usage: ``.venv/bin/python bench/probe_big_shm.py [--rounds 8] [--calls 50]``. Results:
bench/results/probe_big_shm.json (``--results PATH`` for another file).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import ROOT, machine  # noqa: E402

from zinfer.frontdoor import sysshm_maps  # noqa: E402
from zinfer.frontdoor.sysshm import SystemShm  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "probe_big_shm.json"
N = 4 << 20


def _cpu_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return 1e6 * (time.thread_time() - t0) / calls


def _mapped_file(path: Path) -> tuple[int, mmap.mmap]:
    path.write_bytes(os.urandom(N))
    fd = os.open(path, os.O_RDWR)
    return fd, mmap.mmap(fd, N)


def _measure(
    ms: mmap.mmap, md: mmap.mmap, fs: int, fd: int, src: str, rounds: int, calls: int
) -> dict[str, list[float]]:
    a, b = np.frombuffer(ms, np.uint8), np.frombuffer(md, np.uint8)
    uid = os.getuid()
    with tempfile.TemporaryDirectory(prefix="probe-shm-") as tmp:
        regs = {"mapped": SystemShm(Path(tmp) / "m", Path("/dev/shm")),
                "pread": SystemShm(Path(tmp) / "p", Path("/dev/shm"))}  # fmt: skip
        regs["pread"]._maps = sysshm_maps.SegmentMaps(None)
        if sysshm_maps._compiled is None:
            del regs["mapped"]
        cases: dict[str, Callable[[], object]] = {
            "raw memcpy 4 MiB (mapped to mapped)": lambda: np.copyto(b, a),
            "raw preadv 4 MiB (file to mapped)": lambda: os.preadv(fs, [memoryview(b)], 0),
            "raw pwrite 4 MiB (mapped to file)": lambda: os.pwrite(fd, memoryview(a), 0),
        }
        for name, reg in regs.items():
            reg.register(f"r-{name}", src, 0, N, uid=uid)
            cases[f"SystemShm.read 4 MiB ({name})"] = lambda reg=reg, name=name: reg.read(
                f"r-{name}", 0, N, b, uid=uid
            )
            cases[f"SystemShm.write 4 MiB ({name})"] = lambda reg=reg, name=name: reg.write(
                f"r-{name}", 0, N, memoryview(b), uid=uid
            )
        rows: dict[str, list[float]] = {k: [] for k in cases}
        try:
            for r in range(rounds):
                order = list(cases.items()) if r % 2 == 0 else list(cases.items())[::-1]
                for key, fn in order:
                    rows[key].append(_cpu_us(fn, calls))
        finally:
            for reg in regs.values():
                reg.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    tag = uuid.uuid4().hex[:8]
    src_path, dst_path = Path(f"/dev/shm/probe-src-{tag}"), Path(f"/dev/shm/probe-dst-{tag}")
    fs, ms = _mapped_file(src_path)
    fd, md = _mapped_file(dst_path)
    try:
        rows = _measure(ms, md, fs, fd, "/" + src_path.name, args.rounds, args.calls)
    finally:
        ms.close()
        md.close()
        os.close(fs)
        os.close(fd)
        src_path.unlink()
        dst_path.unlink()
    med = {k: round(statistics.median(v), 1) for k, v in rows.items()}
    base = med["raw memcpy 4 MiB (mapped to mapped)"]
    print(f"{'CPU us per call (median of rounds)':44s} {'us':>8} {'x memcpy':>9}")
    for k, v in med.items():
        print(f"{k:44s} {v:8.1f} {v / base:9.2f}")
    out: dict[str, Any] = {
        "machine": machine(),
        "params": {"rounds": args.rounds, "calls": args.calls},
        "helper_built": sysshm_maps.mapped_copies(),
        "cpu_us_median": med,
        "rounds": rows,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
