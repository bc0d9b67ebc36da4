"""The c32 floor: what the design itself allows for issue 31's concurrency-32 goals, beside zinfer and Triton
in turns in one run, with rate, p50 and CPU per request per process.

Levels (each turn a fresh child process and fresh servers):

* ``bare``: ``floor_relay``'s bare relay pipelined (32 out, each request a message; the frames of a real
  ``add`` request): the relay the issue's c32 CPU goal is a ratio to;
* ``floor-add0``: ``floor_relay``'s ``numpy`` floor at c32 (the built-in add, no python-backend contract);
* ``floor-add``: ``floor_ens_procs`` + ``floor_pb``: the Triton-style ``add`` through the python-backend
  contract (its own ``model.py`` run on the cheapest ``pb_utils`` objects), one instance, batched as the
  broker does while the instance is busy; the client keeps 32 out, what it has sent as one BUNDLE;
* ``floor-ens``: the same for ``text_ensemble``: client -> broker -> tokenizer (2 processes, serial runs) ->
  broker -> lm (2, batched) -> broker -> detokenizer (2) -> broker -> client, real records, real model code;
* ``floor-ens1``: ``floor-ens`` with one request per EXECUTE to the steps without dynamic batching (no
  serial runs: each request a message to and from the worker, as Triton's default scheduler gives an
  instance one request at a time);
* ``zinfer``: ``zinfer serve`` on ``vs_triton_repo`` (compiled with ``--compiled``, as bench_vs_triton's
  ``--compiled``), one ``AsyncClient`` with 32 tasks on ``add``, then on ``text_ensemble``;
* ``triton``: Triton 2.51 on the same repository, perf_analyzer at concurrency 32 on ``add``, then on
  ``text_ensemble``; CPU per request from the server's processes (tritonserver, each model's stubs) and
  perf_analyzer's, over the requests Triton's statistics counted in that time.

CPU is read from the kernel's per-thread counters (``ab_compiled_ensemble.cpu_s``). The order of the levels
is reversed every other round.

Usage: ``.venv/bin/python bench/floor_ensemble.py --triton-venv DIR [--rounds 2] [--seconds 2]
[--compiled [--build DIR]] [--label L]``. Results: bench/results/floor_ensemble.json (an entry per label)
and floor_ensemble.txt (their tables).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "floor_ensemble.json"
TABLE = HERE / "results" / "floor_ensemble.txt"
LEVELS = ("bare", "floor-add0", "floor-add", "floor-ens", "floor-ens1", "zinfer", "triton")
FLOOR_MODULES = ("floor_procs", "floor_pb", "floor_ens_procs")
STEPS = ("tokenizer", "lm", "detokenizer")
WINDOW = 32
WARMUP = 200
TURN_TIMEOUT_S = 240


# ------------------------------------------------------------------------------------ one turn (child)


def _floor_turn(model: str, seconds: float, runs: bool = True) -> dict[str, Any]:
    """The floor of ``add`` or ``text_ensemble`` at c32: its broker and workers, a pipelined client."""
    import floor_ens_procs as fe
    import vs_triton_repo
    import zmq
    from ab_compiled_ensemble import cpu_s
    from floor_relay import _figures

    names = [n for n, *_ in fe.PLANS[model]]
    d = tempfile.mkdtemp(prefix="zfe-")
    repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=False)
    front, back = f"ipc://{d}/front", f"ipc://{d}/back"
    run = [sys.executable, "-c", "import floor_ens_procs; floor_ens_procs.main()"]
    env = {**os.environ, "PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{HERE}"}
    one = [] if runs else ["--one"]
    procs = [subprocess.Popen([*run, "broker", front, back, *one, *names], env=env)]
    pids: dict[str, list[int]] = {"broker": [procs[0].pid]}
    time.sleep(0.3)
    for n in names:
        for _ in range(fe.SPECS[n][2]):
            procs.append(
                subprocess.Popen([*run, "worker", back, n, str(repo / n / "1" / "model.py")], env=env)
            )
            pids.setdefault(n, []).append(procs[-1].pid)
    pids["client"] = [os.getpid()]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(front)
    fc = fe.EnsClient(model, vs_triton_repo.TEXT)
    expected = vs_triton_repo.EXPECTED if model != "add" else None
    try:
        for _ in range(WARMUP):  # one at a time, every answer checked
            sock.send_multipart(fc.request()[1])
            if not sock.poll(30_000):
                raise TimeoutError(f"floor {model}: no answer")
            fc.replies(sock.recv_multipart())
            v = fc.last
            ok = bytes(v[0, 0]) == expected if expected is not None else float(v[0, 0]) == 3.0
            if not ok or v.shape != (1, 1):
                raise RuntimeError(f"floor {model}: wrong answer {v!r}")
        fc.lats.clear()

        def cpu() -> dict[str, float]:
            return {k: sum(cpu_s(p) for p in ps) for k, ps in pids.items()}

        t0 = cpu()
        start = time.perf_counter()
        end = start + seconds
        sent = done = 0
        while time.perf_counter() < end or done < sent:
            room = WINDOW - (sent - done) if time.perf_counter() < end else 0
            if room > 0:  # what it has, as one message (a BUNDLE when several), as the AsyncClient sends
                sock.send_multipart(fc.requests(room))
                sent += room
            if not sock.poll(5000):
                raise TimeoutError(f"floor {model}: pipelined run timed out")
            while True:
                try:
                    done += fc.replies(sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        dt = time.perf_counter() - start
        t1 = cpu()
        v = fc.last
        if (bytes(v[0, 0]) != expected) if expected is not None else float(v[0, 0]) != 3.0:
            raise RuntimeError(f"floor {model}: wrong answer under load {v!r}")
    finally:
        sock.close()
        for p in procs:
            p.kill()
            p.wait(5)
        for name in ("front", "back"):
            try:
                os.unlink(f"{d}/{name}")
            except FileNotFoundError:
                pass
    return _figures(done, dt, fc.lats, {k: t1[k] - t0[k] for k in t0})


def _zinfer_turn(seconds: float) -> dict[str, Any]:
    """``zinfer serve`` on the repository: one AsyncClient, 32 tasks, on ``add`` then ``text_ensemble``."""
    import asyncio

    import psutil
    import vs_triton_repo
    import zinfer_side as z
    from ab_compiled_ensemble import cpu_s
    from floor_relay import _figures

    from zinfer.broker.compiled import compiled_here
    from zinfer.client import AsyncClient

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zfe-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=True)
        with z.serve(repo) as s:
            pids: dict[str, list[int]] = {"broker": [s.pid], "client": [os.getpid()], "other": []}
            for p in psutil.Process(s.pid).children(recursive=True):
                cmd = p.cmdline()
                name = cmd[cmd.index("--model") + 1] if "--model" in cmd[:-1] else "other"
                pids.setdefault(name if name in (*STEPS, "add") else "other", []).append(p.pid)

            def cpu() -> dict[str, float]:
                return {k: sum(cpu_s(p) for p in ps) for k, ps in pids.items()}

            async def run(model: str) -> dict[str, Any]:
                inputs = z.TEXT_INPUTS if model == "text_ensemble" else z.ADD_INPUTS
                keep = ("broker", "client", "other", *(STEPS if model == "text_ensemble" else ("add",)))
                async with AsyncClient(s.url, timeout=z.TIMEOUT_S) as c:
                    for _ in range(WARMUP):
                        if not z._check(model, await c.infer(model, inputs)):
                            raise RuntimeError(f"zinfer {model}: wrong result")
                    lats: list[float] = []
                    end = time.perf_counter() + seconds

                    async def loop() -> None:
                        while time.perf_counter() < end:
                            t = time.perf_counter()
                            r = await c.infer(model, inputs)
                            lats.append((time.perf_counter() - t) * 1e6)
                        if not z._check(model, r):
                            raise RuntimeError(f"zinfer {model}: wrong result under load")

                    t0 = cpu()
                    start = time.perf_counter()
                    await asyncio.gather(*(loop() for _ in range(WINDOW)))
                    dt = time.perf_counter() - start
                    t1 = cpu()
                return _figures(len(lats), dt, lats, {k: t1[k] - t0[k] for k in keep})

            out["add"] = asyncio.run(run("add"))
            out["ens"] = asyncio.run(run("text_ensemble"))
    out["compiled_modules"] = len(compiled_here())
    return out


def _triton_turn(venv: str, interval_ms: int) -> dict[str, Any]:
    """Triton on the repository: perf_analyzer at c32 on ``add``, then on ``text_ensemble``."""
    import urllib.request

    import psutil
    import triton_side
    import vs_triton_repo
    from ab_compiled_ensemble import cpu_s

    install = triton_side.find(Path(venv))
    if install is None:
        raise SystemExit(f"no Triton in {venv}")
    models = ("add", *STEPS, "text_ensemble")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zfe-") as d:
        repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=False)
        with triton_side.serve(install, repo, models) as s:
            pids: dict[str, list[int]] = {"broker": [s.pid], "other": []}
            for p in psutil.Process(s.pid).children(recursive=True):
                cmd = " ".join(p.cmdline())
                name = next((m for m in (*STEPS, "add") if f"/{m}/1/" in cmd or f"/{m}/" in cmd), "other")
                pids.setdefault(name, []).append(p.pid)

            def count(model: str) -> int:
                with urllib.request.urlopen(f"http://{s.http}/v2/models/{model}/stats", timeout=10) as r:
                    doc = json.loads(r.read())
                return int(doc["model_stats"][0]["inference_stats"]["success"]["count"])

            for key, model, shape, extra in (
                ("add", "add", {"INPUT_A": 1, "INPUT_B": 1}, ()),
                ("ens", "text_ensemble", {"TEXT": 1}, ("--string-data", vs_triton_repo.TEXT.decode())),
            ):
                keep = ("broker", "other", *(STEPS if model == "text_ensemble" else ("add",)))
                n0, c0 = count(model), {k: sum(cpu_s(p) for p in pids[k]) for k in keep}
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                pa = triton_side.perf_analyzer(s, model, WINDOW, shape, interval_ms, extra)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                n = count(model) - n0
                c1 = {k: sum(cpu_s(p) for p in pids[k]) for k in keep}
                per = {f"{k}_us": round((c1[k] - c0[k]) / max(1, n) * 1e6, 1) for k in keep}
                client = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / max(1, n) * 1e6
                per["client_us"] = round(client, 1)
                per["total_us"] = round(sum(v for k, v in per.items() if k != "total_us"), 1)
                out[key] = {"requests": n, "rate_s": pa["throughput_s"], "p50_us": pa["p50_us"], **per,
                            "pa_stability": pa["stability_percentage"]}  # fmt: skip
    return out


def child(level: str, seconds: float, venv: str) -> None:
    # bench/ last: a mypyc build of the floor modules on PYTHONPATH comes first
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
    from floor_relay import _relay_turn

    turns = {
        "bare": lambda: {"add": _relay_turn("bare", "c32", seconds)},
        "floor-add0": lambda: {"add": _relay_turn("numpy", "c32", seconds)},
        "floor-add": lambda: {"add": _floor_turn("add", seconds)},
        "floor-ens": lambda: {"ens": _floor_turn("text_ensemble", seconds)},
        "floor-ens1": lambda: {"ens": _floor_turn("text_ensemble", seconds, runs=False)},
        "zinfer": lambda: _zinfer_turn(seconds),
        "triton": lambda: _triton_turn(venv, int(seconds * 1000)),
    }
    out: dict[str, Any] = turns[level]()
    if level.startswith("floor"):  # the floor's processes run what this process imported first
        out["floor_compiled"] = not str(sys.modules["floor_procs"].__file__).endswith(".py")
    print(json.dumps(out))


# -------------------------------------------------------------------------------------------- the run


def turn(tree: str, level: str, seconds: float, venv: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(
        [sys.executable, __file__, "--child", level, str(seconds), venv],
        env=env, cwd="/", capture_output=True, text=True, timeout=TURN_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{level} failed:\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


COLUMNS = ("rate_s", "p50_us", "broker_us", "add_us", "worker_us", *(f"{s}_us" for s in STEPS), "other_us",
           "client_us", "total_us")  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per load and level; the ratios the issue's goals are about."""
    med: dict[str, dict[str, float]] = {}
    for key, xs in runs.items():
        med[key] = {c: statistics.median(x[c] for x in xs) for c in COLUMNS if all(x.get(c) is not None
                                                                                    for x in xs)}  # fmt: skip

    def q(a: str, b: str, col: str = "rate_s") -> float | None:
        x, y = med.get(a, {}).get(col), med.get(b, {}).get(col)
        return round(x / y, 3) if x and y else None

    ratios = {}
    for load in ("add", "ens"):
        fl = f"{load}/floor-{load}"
        ratios[f"{load}_c32_rate_floor_over_triton"] = q(fl, f"{load}/triton")
        ratios[f"{load}_c32_rate_zinfer_over_triton"] = q(f"{load}/zinfer", f"{load}/triton")
        ratios[f"{load}_c32_rate_zinfer_over_floor"] = q(f"{load}/zinfer", fl)
        ratios[f"{load}_c32_cpu_zinfer_over_floor"] = q(f"{load}/zinfer", fl, "total_us")
        ratios[f"{load}_c32_cpu_floor_over_triton"] = q(fl, f"{load}/triton", "total_us")
    ratios["add_c32_cpu_floor_over_bare"] = q("add/floor-add", "add/bare", "total_us")
    ratios["add_c32_cpu_floor_add0_over_bare"] = q("add/floor-add0", "add/bare", "total_us")
    ratios["add_c32_cpu_zinfer_over_bare"] = q("add/zinfer", "add/bare", "total_us")
    return {"medians": med, "ratios": ratios}


def table(s: dict[str, Any]) -> str:
    heads = ("rate/s", "p50", "broker", "add", "worker", "tok", "lm", "detok", "other", "client", "total")
    lines = [f"{'load/level':<18}" + "".join(f"{h:>8}" for h in heads) + "   (CPU us per request)"]
    for key, m in s["medians"].items():
        lines.append(f"{key:<18}" + "".join(f"{m[c]:>8.0f}" if c in m else f"{'-':>8}" for c in COLUMNS))
    lines += [f"  {k:<40} {v}" for k, v in s["ratios"].items()]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--triton-venv", default="/work/tritonvenv")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--label", default="latest", help="the results entry this run writes (replaces)")
    ap.add_argument("--compiled", action="store_true", help="zinfer and the floor compiled by mypyc")
    ap.add_argument("--build", type=Path, help="with --compiled: reuse (or make) the builds in this folder")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_serving import machine
    from floor_relay import build_floor, pure_tree

    t_start = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="zfe-tree-") as tmp:
        pure = pure_tree(Path(tmp) / "pure")
        tree = str(pure)
        if args.compiled:
            from bench_compiled import build_compiled

            work = args.build or Path(tmp) / "build"
            zinfer = work / "path" if (work / "path").exists() else build_compiled(work)
            floor = work / "floor"  # with --build, kept and reused: remove it after changing the floor
            if not all(list(floor.glob(f"{m}.*.so")) for m in FLOOR_MODULES):
                build_floor(floor, pure, FLOOR_MODULES)
            tree = f"{floor}:{zinfer}"
        runs: dict[str, list[dict[str, Any]]] = {}
        levels = args.levels.split(",")
        for r in range(args.rounds):
            for level in levels if r % 2 == 0 else levels[::-1]:
                res = turn(tree, level, args.seconds, args.triton_venv)
                for load in ("add", "ens"):
                    if load in res:
                        runs.setdefault(f"{load}/{level}", []).append(res[load])
                print(f"round {r} {level}: {json.dumps(res)}", flush=True)
    s = summarize(runs)
    text = table(s)
    print(text)
    run = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(
            ["bench/floor_ensemble.py", *(("DIR" if a.startswith("/") else a) for a in sys.argv[1:])]
        ),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": machine(),
        "params": {
            "rounds": args.rounds,
            "seconds": args.seconds,
            "window": WINDOW,
            "compiled": args.compiled,
        },
        **s,
        "table": text.splitlines(),
        "runs": runs,
        "wall_s": round(time.monotonic() - t_start, 1),
        "load_average_1m_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    doc: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.setdefault("runs", {})[args.label] = run
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    TABLE.write_text("".join(
        f"[{label}] {r['date']} {r['command']} (commit {r['commit']}), medians of {r['params']['rounds']} "
        f"rounds of {r['params']['seconds']} s, 1-minute load average before/after "
        f"{r['load_average_1m_before_after']}\n" + "\n".join(r["table"]) + "\n\n"
        for label, r in doc["runs"].items()
    ))  # fmt: skip
    print(f"written: {RESULTS}, {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
