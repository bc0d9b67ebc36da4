"""How the three-step ensemble's traffic reaches the broker at 32 in flight, through the gRPC door and from
the native ``AsyncClient``, on one zinfer server: requests per message the sender's ``AsyncConnection`` sends
(a BUNDLE carries several), the mean EXECUTE size per step (the broker's statistics: inferences over
executions), and wakes per request (voluntary context switches) and CPU per request by process.

The sender's counts come from a ``sitecustomize`` this script writes into a temporary folder on the
``PYTHONPATH`` of the server and of the native client: it wraps ``async_connection.send_messages`` and writes
its counts to a file per process every half second (measurement only; nothing of it is in zinfer).

Usage: ``.venv/bin/python bench/door_ens_shape.py --triton-venv DIR [--seconds 5] [--rounds 1]
[--variant NAME:PYTHONPATH=TREE ...]``. Printed only (no results file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_side  # noqa: E402
import vs_triton_repo  # noqa: E402
from ab_door_ensemble import native_turn  # noqa: E402
from ab_frontdoor_http import _environment, _variant  # noqa: E402
from bench_frontdoor import zinfer_front_door  # noqa: E402
from bench_frontdoor_ensemble import _role, _tree, turn  # noqa: E402

from zinfer.client import Client  # noqa: E402

COUNTER = r"""
import atexit, json, os, threading, time
try:
    import zinfer.client.async_connection as _ac
except Exception:
    _ac = None
if _ac is not None:
    _send, _stats = _ac.send_messages, {"sends": 0, "messages": 0}
    def _counted(sock, items):
        n = _send(sock, items)
        _stats["sends"] += 1
        _stats["messages"] += n
        return n
    _ac.send_messages = _counted
    def _dump():
        if _stats["sends"]:
            with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
                json.dump(_stats, f)
    def _every():
        while True:
            time.sleep(0.5)
            _dump()
    threading.Thread(target=_every, daemon=True).start()
    atexit.register(_dump)
"""

STEPS = ("tokenizer", "lm", "detokenizer", "text_ensemble")


def _counts(folder: Path) -> dict[int, dict[str, int]]:
    out = {}
    for f in folder.glob("*.json"):
        with contextlib.suppress(ValueError, OSError):
            out[int(f.stem)] = json.loads(f.read_text())
    return out


def _stats(url: str) -> dict[str, tuple[int, int]]:
    with Client(url) as c:
        body = c.statistics()
    return {s["name"]: (int(s["inference_count"]), int(s["execution_count"])) for s in body["model_stats"]}


def _switches(root: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in _tree(root):
        try:
            n = p.num_ctx_switches().voluntary
            role = _role(p, root, "zinfer")
        except psutil.Error:
            continue
        out[role] = out.get(role, 0) + n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--triton-venv", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--sides", default="door,native")
    args = ap.parse_args()
    install = triton_side.find(args.triton_venv)
    python = install.python if install is not None else args.triton_venv / "bin" / "python"
    variants = [_variant(v) for v in args.variant] or [("here", {})]
    with tempfile.TemporaryDirectory(prefix="zdes-") as tmp, contextlib.ExitStack() as stack:
        site, counts = Path(tmp) / "site", Path(tmp) / "counts"
        site.mkdir()
        counts.mkdir()
        (site / "sitecustomize.py").write_text(f"OUT = {str(counts)!r}\n" + COUNTER)
        repo = vs_triton_repo.write(Path(tmp) / "models", zinfer_only=False)
        servers = []
        for name, extra in variants:
            env = dict(extra)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), extra.get("PYTHONPATH", "")) if p)
            with _environment(env):
                target = stack.enter_context(zinfer_front_door(repo, 1))
            assert target.door_pid is not None
            servers.append((name, env, target, psutil.Process(target.door_pid).ppid()))
        for r in range(args.rounds):
            for name, env, target, root in servers if r % 2 == 0 else servers[::-1]:
                sides = args.sides.split(",")
                for side in sides if r % 2 == 0 else sides[::-1]:
                    c0, s0, w0 = _counts(counts), _stats(target.broker_url), _switches(root)
                    if side == "door":
                        fig = turn(python, target.grpc, args.seconds, root, "zinfer")
                    else:
                        fig = native_turn(target.broker_url, args.seconds, root, env)
                    time.sleep(0.7)  # the counters' next write
                    c1, s1, w1 = _counts(counts), _stats(target.broker_url), _switches(root)
                    if "error" in fig:
                        print(f"{name} {side} failed: {fig['error'][-400:]}")
                        continue
                    n = max(1, fig["requests"])
                    sender = target.door_pid if side == "door" else max(set(c1) - set(c0), default=0)
                    a, b = c0.get(sender, {}), c1.get(sender, {})
                    sends = b.get("sends", 0) - a.get("sends", 0)
                    msgs = b.get("messages", 0) - a.get("messages", 0)
                    per_send = f"{msgs / sends:.1f}" if sends else "-"
                    sizes = {m: (s1[m][0] - s0[m][0]) / max(1, s1[m][1] - s0[m][1]) for m in STEPS if m in s1}
                    execs = " ".join(f"{m} {v:.1f}" for m, v in sizes.items())
                    wakes = " ".join(f"{k} {(w1[k] - w0.get(k, 0)) / n:.1f}" for k in sorted(w1))
                    cpu = " ".join(f"{k} {v:.0f}" for k, v in fig["server_cpu_us_per_request"].items())
                    rate = f"{fig['throughput_s']:7.1f}/s p50 {fig['p50_us']:6.0f} us"
                    print(f"round {r} {name} {side:6s} {rate} | requests per send {per_send} | "
                          f"mean execute size: {execs} | wakes/req: {wakes} | "
                          f"cpu us/req: {cpu}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
