"""What the design itself costs: the bare relay, the floor relay (zinfer's unavoidable per-message work on
the bare relay's sockets) and zinfer, in turns in one run, with p50, rate and CPU per request per process.

Levels, each with the same three processes (client DEALER -> broker ROUTER/ROUTER -> worker DEALER):

* ``bare``: ``baseline.py``'s forwarder and echo worker, the frames of a real ``add`` request
  (``bench_serving.bare_frames``): the relay bench_vs_triton's goals are ratios to;
* ``codec``: ``floor_procs``: every message a real INFER / EXECUTE / RESULT / REPLY, encoded and decoded
  with zinfer's own records and encoders, the model looked up, the batch kept and answered;
* ``numpy``: ``codec`` plus the arrays: inputs from the client's arrays, the worker's sum, the output array;
* ``packed`` (c1 only): ``numpy`` with every header a fixed ``struct`` layout instead of zinfer's
  MessagePack records (``floor_procs``' packed level): what a cheaper codec could at best take off the floor;
* ``zinfer``: ``zinfer serve`` with ``add0`` (the built-in add, delay 0) and one sync ``Client`` at c1, one
  ``AsyncClient`` at c32; ``zinfer-add``: the Triton-style ``add`` model (delay 500 us) at c32, the model
  of the issue's c32 CPU goal.

Loads: ``c1``: one request in flight, closed loop; ``c32``: 32 in flight (bare and floor: one pipelined
DEALER that keeps 32 out, as ``baseline.bare_rate`` does, the floor's sending what it has as one BUNDLE as
the AsyncClient does; zinfer: 32 tasks of one ``AsyncClient``); ``c32s``: bare and floor only, 32 out, every
request a message of its own, as a front door's requests come to the broker (one per wake).

Every turn runs in a fresh child process whose ``zinfer`` is a tree given by folder (a symlink tree of this
checkout, made here; with ``--compiled``, also a mypyc build of it, ``bench_compiled.build_compiled``),
with fresh server processes; levels alternate within each round and their order is reversed every other
round. CPU per request: user + system time of each process over the timed part, over the requests done.

Usage: ``.venv/bin/python bench/floor_relay.py [--loads c1,c32] [--rounds 3] [--seconds 2] [--label L]
[--compiled [--build DIR] [--only-compiled]]``. Results: bench/results/floor_relay.json (an entry per label)
and floor_relay.txt (their tables).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "floor_relay.json"
TABLE = HERE / "results" / "floor_relay.txt"
PACKAGES = ("client", "modelconfig", "broker", "workers", "tools", "frontdoor", "configs")
LEVELS = ("bare", "codec", "numpy", "zinfer")
LOADS = {"c1": (*LEVELS, "packed"), "c32": (*LEVELS, "zinfer-add"), "c32s": ("bare", "codec", "numpy")}
WINDOW = 32
WARMUP = 200
TURN_TIMEOUT_S = 240


# ------------------------------------------------------------------------------------ one turn (child)


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _spawn_relay(level: str, d: str) -> tuple[str, list[Any], dict[str, int]]:
    """The broker and worker of ``level`` (bare or floor), their pids by role; returns the client endpoint."""
    front, back = f"ipc://{d}/front", f"ipc://{d}/back"
    if level == "bare":
        import baseline

        ctx = mp.get_context("fork")
        procs: list[Any] = [ctx.Process(target=baseline._forwarder, args=(front, back), daemon=True)]
        procs[0].start()
        time.sleep(0.2)
        procs.append(ctx.Process(target=baseline._echo_worker, args=(back,), daemon=True))
        procs[1].start()
    else:
        # floor_procs as this process imports it: the mypyc build when its folder is on PYTHONPATH
        run = [sys.executable, "-c", "import floor_procs; floor_procs.main()"]
        env = {**os.environ, "PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{HERE}"}
        procs = [subprocess.Popen([*run, "broker", level, front, back], env=env)]
        time.sleep(0.3)
        procs.append(subprocess.Popen([*run, "worker", level, back], env=env))
    return front, procs, {"broker": procs[0].pid, "worker": procs[1].pid}


def _relay_turn(level: str, load: str, seconds: float) -> dict[str, Any]:
    import floor_procs
    import zmq
    from bench_serving import bare_frames

    d = tempfile.mkdtemp(prefix="zfl-")
    front, procs, pids = _spawn_relay(level, d)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(front)
    fc: Any = None if level == "bare" else (
        floor_procs.PackedClient() if level == "packed" else floor_procs.FloorClient(arrays=level == "numpy")
    )
    frames = bare_frames()

    def make() -> list[Any]:
        return frames if fc is None else fc.request()[1]

    def take(msg: list[bytes]) -> int:
        return 1 if fc is None else fc.replies(msg)

    try:
        for _ in range(WARMUP):  # and every answer checked: the right request, the right sum
            if fc is None:
                sock.send_multipart(frames)
            else:
                rid, msg = fc.request()
                sock.send_multipart(msg)
            if not sock.poll(10_000):
                raise TimeoutError(f"{level}: no answer")
            got = sock.recv_multipart()
            if fc is None:
                if got != frames:
                    raise RuntimeError("bare: the echo is not the request")
            elif not fc.right(rid, got):
                raise RuntimeError(f"{level}: wrong answer {fc.reply(got)!r}")
        t0 = {k: _cpu(p) for k, p in {**pids, "client": os.getpid()}.items()}
        lats: list[float] = []
        start = time.perf_counter()
        end = start + seconds
        done = 0
        if load == "c1":
            while time.perf_counter() < end:
                t = time.perf_counter()
                sock.send_multipart(make())
                if not sock.poll(5000):
                    raise TimeoutError(f"{level}: round trip timed out")
                take(sock.recv_multipart())
                lats.append((time.perf_counter() - t) * 1e6)
            done = len(lats)
        else:
            sent = 0
            while time.perf_counter() < end or done < sent:
                room = WINDOW - (sent - done) if time.perf_counter() < end else 0
                if room > 0 and fc is not None and load == "c32":  # what it has, as one message (BUNDLE)
                    sock.send_multipart(fc.requests(room))
                    sent += room
                for _ in range(room if fc is None or load == "c32s" else 0):  # each alone
                    sock.send_multipart(make())
                    sent += 1
                if not sock.poll(5000):
                    raise TimeoutError(f"{level}: pipelined run timed out")
                while True:
                    try:
                        done += take(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
        dt = time.perf_counter() - start
        t1 = {k: _cpu(p) for k, p in {**pids, "client": os.getpid()}.items()}
    finally:
        sock.close()
        for p in procs:
            p.kill()
            p.wait(5) if hasattr(p, "wait") else p.join(5)
        for name in ("front", "back"):
            try:
                os.unlink(f"{d}/{name}")
            except FileNotFoundError:
                pass
        os.rmdir(d)
    return _figures(done, dt, lats, {k: t1[k] - t0[k] for k in t0})


def _figures(n: int, dt: float, lats: list[float], cpu_s: dict[str, float]) -> dict[str, Any]:
    per = {f"{k}_us": round(v / max(1, n) * 1e6, 1) for k, v in cpu_s.items()}
    per["total_us"] = round(sum(v / max(1, n) * 1e6 for v in cpu_s.values()), 1)
    p50 = round(statistics.median(lats), 1) if lats else None
    return {"requests": n, "rate_s": round(n / dt, 1), "p50_us": p50, **per}


def _zinfer_turn(level: str, load: str, seconds: float) -> dict[str, Any]:
    import vs_triton_repo
    import zinfer_side as z

    with tempfile.TemporaryDirectory(prefix="zfl-") as tmp:
        repo = Path(tmp) / "repo"
        vs_triton_repo._model(repo, "add0", vs_triton_repo._ADD0_CONFIG, None)
        vs_triton_repo._model(repo, "add", vs_triton_repo._ADD_CONFIG, vs_triton_repo._ADD_MODEL)
        model = "add" if level == "zinfer-add" else "add0"
        with z.serve(repo) as s:
            if load == "c1":
                r = z.sync_latency(s, model, seconds, 10_000_000)
            else:
                r = z.async_closed(s, model, WINDOW, seconds, 10_000_000)
    c = r["cpu_per_request"]
    if r.get("errors"):
        raise SystemExit(f"{level} {load}: {r['errors']} errors")
    return {"requests": r["requests"], "rate_s": r["throughput_s"], "p50_us": r["p50_us"],
            "broker_us": c["broker_us"], "worker_us": c["workers_us"], "client_us": c["client_us"],
            "total_us": c["total_us"]}  # fmt: skip


def child(level: str, load: str, seconds: float) -> None:
    # bench/ last: a mypyc build of floor_procs on PYTHONPATH comes first
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
    out = _relay_turn(level, load, seconds) if level in ("bare", "codec", "numpy", "packed") else (
        _zinfer_turn(level, load, seconds)
    )  # fmt: skip
    if level in ("bare", "codec", "numpy", "packed"):
        import floor_procs

        out["floor_compiled"] = not floor_procs.__file__.endswith(".py")
    else:
        from zinfer.broker.compiled import compiled_here

        out["zinfer_compiled_modules"] = len(compiled_here())  # in the client; the server runs the same tree
    print(json.dumps(out))


# -------------------------------------------------------------------------------------------- the run


def pure_tree(work: Path) -> Path:
    """A folder that, on PYTHONPATH, imports this checkout as ``zinfer``."""
    (work / "zinfer").mkdir(parents=True)
    for pkg in PACKAGES:
        (work / "zinfer" / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    return work


def build_floor(work: Path, pure: Path, modules: tuple[str, ...] = ("floor_procs",)) -> Path:
    """``modules`` (bench/'s, ``floor_procs`` by default) compiled with mypyc in ``work``; returns the folder
    to put on PYTHONPATH."""
    work.mkdir(parents=True, exist_ok=True)
    files = [f"{name}.py" for name in modules]
    for f in files:
        shutil.copy2(HERE / f, work / f)
    mypyc = Path(sys.executable).parent / "mypyc"
    env = {**os.environ, "MYPYPATH": str(pure)}
    done = subprocess.run(
        [str(mypyc), *files], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0 or any(not list(work.glob(f"{name}.*.so")) for name in modules):
        raise SystemExit(f"mypyc {' '.join(files)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    for f in files:
        (work / f).unlink()
    return work


def turn(tree: str, level: str, load: str, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--child", level, load, str(seconds)],
        env=env, cwd="/", capture_output=True, text=True, timeout=TURN_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tree} {level} {load} failed:\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


FIELDS = ("p50_us", "rate_s", "broker_us", "worker_us", "client_us", "total_us")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per build, load and level, and each level's ratio to ``bare`` of the same load."""
    med: dict[str, Any] = {}
    for key, xs in runs.items():
        med[key] = {f: statistics.median(x[f] for x in xs) if xs[0][f] is not None else None for f in FIELDS}
    for key, m in med.items():
        bare = med.get("/".join([*key.split("/")[:2], "bare"]))
        if bare is not None:
            m["over_bare"] = {
                f: round(m[f] / bare[f], 2) for f in ("p50_us", "total_us", "rate_s") if m[f] and bare[f]
            }
    return med


def table(med: dict[str, Any]) -> str:
    head = f"{'build/load/level':<24} {'p50 us':>8} {'rate/s':>8} {'broker':>7} {'worker':>7} {'client':>7}"
    head += f" {'total':>7}   {'p50/bare':>8} {'cpu/bare':>8} {'rate/bare':>9}"
    lines = [head]
    for key, m in med.items():
        r = m.get("over_bare", {})
        p50 = f"{m['p50_us']:>8.0f}" if m["p50_us"] is not None else f"{'-':>8}"
        lines.append(
            f"{key:<24} {p50} {m['rate_s']:>8.0f} {m['broker_us']:>7.1f} {m['worker_us']:>7.1f}"
            f" {m['client_us']:>7.1f} {m['total_us']:>7.1f}   {r.get('p50_us', '-')!s:>8}"
            f" {r.get('total_us', '-')!s:>8} {r.get('rate_s', '-')!s:>9}"
        )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--loads", default="c1,c32")
    ap.add_argument("--label", default="latest", help="the results entry this run writes (replaces)")
    ap.add_argument("--compiled", action="store_true", help="also every level on a mypyc build")
    ap.add_argument("--build", type=Path, help="with --compiled: reuse (or make) the build in this folder")
    ap.add_argument("--only-compiled", action="store_true", help="with --compiled: skip the pure build")
    args = ap.parse_args()
    t_start = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="zfl-tree-") as tmp:
        pure = pure_tree(Path(tmp) / "pure")
        trees: dict[str, str] = {} if args.only_compiled else {"pure": str(pure)}
        if args.compiled:  # zinfer's mypyc build, and floor_procs compiled by mypyc before it on the path
            sys.path.insert(0, str(HERE))
            from bench_compiled import build_compiled

            work = args.build or Path(tmp) / "build"
            zinfer = work / "path" if (work / "path").exists() else build_compiled(work)
            trees["compiled"] = f"{build_floor(Path(tmp) / 'floor', pure)}:{zinfer}"
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for load in args.loads.split(","):
                order = [(b, lv) for b in trees for lv in LOADS[load]]
                for build, level in order if r % 2 == 0 else order[::-1]:
                    res = turn(trees[build], level, load, args.seconds)
                    runs.setdefault(f"{build}/{load}/{level}", []).append(res)
                    print(f"round {r} {build} {load} {level}: {json.dumps(res)}", flush=True)
    med = summarize(runs)
    text = table(med)
    print(text)
    sys.path.insert(0, str(HERE))
    from bench_serving import machine

    run = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(
            ["bench/floor_relay.py", *(("DIR" if a.startswith("/") else a) for a in sys.argv[1:])]
        ),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": machine(),
        "params": {"rounds": args.rounds, "seconds": args.seconds, "window": WINDOW, "warmup": WARMUP},
        "medians": med,
        "table": text.splitlines(),
        "runs": runs,
        "wall_s": round(time.monotonic() - t_start, 1),
        "load_average_1m_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    write_results(RESULTS, TABLE, args.label, run)
    return 0


def write_results(results: Path, table: Path, label: str, run: dict[str, Any]) -> None:
    """``run`` as the ``label`` entry of ``results`` (JSON, other labels kept), and every entry's table in
    ``table``."""
    doc: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    doc.setdefault("runs", {})[label] = run
    results.write_text(json.dumps(doc, indent=2) + "\n")
    table.write_text("".join(
        f"[{name}] {r['date']} {r['command']} (commit {r['commit']}), medians of {r['params']['rounds']} "
        f"rounds of {r['params']['seconds']} s, 1-minute load average before/after "
        f"{r.get('load_average_1m_before_after', 'not recorded')}\n" + "\n".join(r["table"]) + "\n\n"
        for name, r in doc["runs"].items()
    ))  # fmt: skip
    print(f"written: {results}, {table}")


if __name__ == "__main__":
    raise SystemExit(main())
