"""One turn of ``floor_ensemble.py``, in a child process of its own: the floor of ``add`` or ``text_ensemble``
at c32 (``floor_ens_procs``, ``floor_pb``), the bare relay and ``add0`` floor (``floor_relay``), zinfer
(``zinfer serve`` and one ``AsyncClient``) or Triton (perf_analyzer); prints its figures as one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS = ("tokenizer", "lm", "detokenizer")
WINDOW = 32
WARMUP = 200


def _sample(pids: dict[str, list[int]]) -> dict[str, tuple[float, int]]:
    """CPU seconds and times scheduled in (the kernel's per-thread schedstat: run time, wait, timeslices) of
    every thread of each role's processes: a process that wakes more per request waits more on busy cores."""
    out = {}
    for role, ps in pids.items():
        cpu = slices = 0
        for pid in ps:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        run, _, n = f.read().split()[:3]
                except (OSError, ValueError):
                    continue
                cpu, slices = cpu + int(run), slices + int(n)
        out[role] = (cpu / 1e9, slices)
    return out


def _result(n: int, dt: float, lats: list[float], t0: dict[str, Any], t1: dict[str, Any]) -> dict[str, Any]:
    """Rate, p50, CPU us per request per role and in all, and wakes (times scheduled in) per request."""
    from floor_relay import _figures

    out = _figures(n, dt, lats, {k: t1[k][0] - t0[k][0] for k in t0})
    out["wakes_per_request"] = round(sum(t1[k][1] - t0[k][1] for k in t0) / max(1, n), 2)
    return out


def _batches(c0: dict[str, dict[str, int]], c1: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Per model, between two snapshots of its statistics counts: inferences per execution (the mean batch;
    1 for a model without dynamic batching) and, where counted (the floor), inferences per EXECUTE message
    (a serial run is one message)."""
    out = {}
    for m, a in c1.items():
        d = {k: v - c0[m][k] for k, v in a.items()}
        got = {"per_execution": round(d["inference_count"] / max(1, d["execution_count"]), 2)}
        if "messages" in d:
            got["per_message"] = round(d["inference_count"] / max(1, d["messages"]), 2)
        out[m] = got
    return out


def _floor_turn(model: str, seconds: float, runs: bool = True) -> dict[str, Any]:
    """The floor of ``add`` or ``text_ensemble`` at c32: its broker and workers, a pipelined client."""
    import floor_ens_procs as fe
    import vs_triton_repo
    import zmq

    names = [n for n, *_ in fe.PLANS[model]]
    d = tempfile.mkdtemp(prefix="zfe-")
    repo = vs_triton_repo.write(Path(d) / "repo", zinfer_only=False)
    front, back = f"ipc://{d}/front", f"ipc://{d}/back"
    run = [sys.executable, "-c", "import floor_ens_procs; floor_ens_procs.main()"]
    stats = Path(d) / "stats.json"
    env = {
        **os.environ,
        "PYTHONPATH": f"{os.environ.get('PYTHONPATH', '')}:{HERE}",
        "FLOOR_STATS": str(stats),
    }

    def counts() -> dict[str, dict[str, int]]:  # the broker's, asked by SIGUSR1
        stats.unlink(missing_ok=True)
        procs[0].send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stats.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the floor broker wrote no statistics")
            time.sleep(0.01)
        got: dict[str, dict[str, int]] = json.loads(stats.read_text())
        return got

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

        s0 = counts()
        t0 = _sample(pids)
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
        t1 = _sample(pids)
        batches = _batches(s0, counts())
        v = fc.last
        if (bytes(v[0, 0]) != expected) if expected is not None else float(v[0, 0]) != 3.0:
            raise RuntimeError(f"floor {model}: wrong answer under load {v!r}")
    finally:
        sock.close()
        for p in procs:
            p.kill()
            p.wait(5)
        shutil.rmtree(d, ignore_errors=True)  # the repository and the ipc endpoints
    return {**_result(done, dt, fc.lats, t0, t1), "batches": batches}


def _zinfer_turn(seconds: float) -> dict[str, Any]:
    """``zinfer serve`` on the repository: one AsyncClient, 32 tasks, on ``add`` then ``text_ensemble``."""
    import asyncio

    import psutil
    import vs_triton_repo
    import zinfer_side as z

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

            async def run(model: str) -> dict[str, Any]:
                inputs = z.inputs_of(model)
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

                    async def counts() -> dict[str, dict[str, int]]:
                        got = {
                            m: (await c.statistics(m))["model_stats"][0] for m in keep if m in (*STEPS, "add")
                        }
                        return {m: {k: int(v[k]) for k in ("inference_count", "execution_count")}
                                for m, v in got.items()}  # fmt: skip

                    s0 = await counts()
                    t0 = _sample({k: pids.get(k, []) for k in keep})
                    start = time.perf_counter()
                    await asyncio.gather(*(loop() for _ in range(WINDOW)))
                    dt = time.perf_counter() - start
                    t1 = _sample({k: pids.get(k, []) for k in keep})
                    batches = _batches(s0, await counts())
                return {**_result(len(lats), dt, lats, t0, t1), "batches": batches}

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

            def stats(model: str) -> dict[str, Any]:
                with urllib.request.urlopen(f"http://{s.http}/v2/models/{model}/stats", timeout=10) as r:
                    doc: dict[str, Any] = json.loads(r.read())["model_stats"][0]
                return doc

            def count(model: str) -> int:
                return int(stats(model)["inference_stats"]["success"]["count"])

            def counts(names: tuple[str, ...]) -> dict[str, dict[str, int]]:
                return {
                    m: {k: int(stats(m)[k]) for k in ("inference_count", "execution_count")} for m in names
                }

            for key, model, shape, extra in (
                ("add", "add", {"INPUT_A": 1, "INPUT_B": 1}, ()),
                ("ens", "text_ensemble", {"TEXT": 1}, ("--string-data", vs_triton_repo.TEXT.decode())),
            ):
                keep = ("broker", "other", *(STEPS if model == "text_ensemble" else ("add",)))
                names = STEPS if model == "text_ensemble" else ("add",)
                n0, s0, c0 = count(model), counts(names), _sample({k: pids.get(k, []) for k in keep})
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                try:
                    pa = triton_side.perf_analyzer(s, model, WINDOW, shape, interval_ms, extra)
                except RuntimeError:  # no two windows within 100 % of each other on these loaded cores
                    pa = triton_side._perf_analyzer(s, model, WINDOW, shape, interval_ms, extra, 1000)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                n = count(model) - n0
                c1 = _sample({k: pids.get(k, []) for k in keep})
                per = {f"{k}_us": round((c1[k][0] - c0[k][0]) / max(1, n) * 1e6, 1) for k in keep}
                client = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / max(1, n) * 1e6
                per["client_us"] = round(client, 1)
                per["total_us"] = round(sum(v for k, v in per.items() if k != "total_us"), 1)
                per["wakes_per_request"] = round(sum(c1[k][1] - c0[k][1] for k in keep) / max(1, n), 2)
                out[key] = {"requests": n, "rate_s": pa["throughput_s"], "p50_us": pa["p50_us"], **per,
                            "pa_stability": pa["stability_percentage"],
                            "batches": _batches(s0, counts(names))}  # fmt: skip
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
