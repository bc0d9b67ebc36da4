"""The sync client's CPU per request alone, best of batches, zinfer trees in turns (and the floor client).

``ab_client_cpu.py``'s stub server (a ROUTER answering every INFER at once with a canned ``add`` reply, in a
process of its own) stands in for the broker and the workers. Each measurement is a fresh process whose
``PYTHONPATH`` is one tree (a symlink tree or a compiled build's path): 500 warm-up calls of
``Client.infer("add0", two [1,1] FP32 inputs)``, then ``--batches`` batches of ``--calls`` calls, of which
the best is kept: the main thread's CPU (``thread_time``) and the process's (all threads, libzmq's I/O
thread included) per call. The best batch is the one least disturbed by other work on the machine, so two
trees compare on a loaded machine where medians of whole runs swing by tens of percent. Trees alternate,
their order reversed every other round; ``--floor`` adds ``floor_procs.FloorClient`` (zinfer's codec and
the arrays, on a plain DEALER: no zinfer client logic), run on the first tree.

Usage: ``.venv/bin/python bench/client_best_of.py TREE [TREE...] [--rounds 6] [--floor]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one(url: str, mode: str, batches: int, calls: int) -> list[float]:
    """[best thread us, best process us] per call of ``mode`` in this process."""
    sys.path.insert(0, str(HERE))
    import ab_client_cpu as a

    def measure(step: Callable[[], object]) -> list[float]:
        for _ in range(500):
            step()
        best_t = best_p = float("inf")
        for _ in range(batches):
            t0, p0 = time.thread_time(), time.process_time()
            for _ in range(calls):
                step()
            best_t = min(best_t, (time.thread_time() - t0) / calls * 1e6)
            best_p = min(best_p, (time.process_time() - p0) / calls * 1e6)
        return [round(best_t, 2), round(best_p, 2)]

    if mode == "floor":
        import floor_procs
        import zmq

        fc = floor_procs.FloorClient(True)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(url)

        def floor_step() -> None:
            sock.send_multipart(fc.request()[1])
            fc.reply([f.buffer for f in sock.recv_multipart(copy=False)])

        return measure(floor_step)
    from zinfer.client import Client

    with Client(url, timeout=10) as c:
        return measure(lambda: c.infer("add0", a.ADD))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--floor", action="store_true")
    args = ap.parse_args()
    runs = [(str(t), "zinfer") for t in args.trees] + ([(str(args.trees[0]), "floor")] if args.floor else [])
    got: dict[tuple[str, str], list[list[float]]] = {r: [] for r in runs}
    with tempfile.TemporaryDirectory(prefix="zcbo-") as tmp:
        os.chmod(tmp, 0o700)
        path = str(Path(tmp) / "stub.sock")
        env = {**os.environ, "PYTHONPATH": str(args.trees[0])}
        stub = subprocess.Popen([sys.executable, str(HERE / "ab_client_cpu.py"), "--stub", path], env=env,
                                stdout=subprocess.PIPE)  # fmt: skip
        try:
            assert stub.stdout is not None and stub.stdout.readline().strip() == b"ready"
            for r in range(args.rounds):
                for tree, mode in runs if r % 2 == 0 else runs[::-1]:
                    cmd = [sys.executable, __file__, "--one", f"ipc://{path}", mode, str(args.batches),
                           str(args.calls)]  # fmt: skip
                    done = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": tree}, capture_output=True,
                                          text=True, timeout=600)  # fmt: skip
                    if done.returncode != 0:
                        raise SystemExit(done.stderr[-3000:])
                    got[(tree, mode)].append(json.loads(done.stdout))
                    print(f"round {r} {mode} {tree}: {done.stdout.strip()}", flush=True)
        finally:
            stub.kill()
            stub.wait()
    first = statistics.median(x[0] for x in got[runs[0]])
    print(f"{'tree':<40} {'mode':<7} {'thread us':>9} {'process us':>10} {'thread/first':>12}")
    for tree, mode in runs:
        t = statistics.median(x[0] for x in got[(tree, mode)])
        p = statistics.median(x[1] for x in got[(tree, mode)])
        print(f"{tree:<40} {mode:<7} {t:>9.2f} {p:>10.2f} {t / first:>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
