"""The floor relay's per-message steps timed warm, each alone in a tight loop in one process: what the
floor's work costs when its code and data stay in cache, beside what it costs in place (``floor_relay.py``,
where the three processes take turns on the cores and each wakes to caches the others have used).

Usage: ``PYTHONPATH=TREE .venv/bin/python bench/floor_micro.py NAME`` (TREE a folder that imports as
``zinfer``, as ``floor_relay.py`` makes them; put a mypyc build of ``floor_procs`` first on PYTHONPATH for
the compiled floor). Prints the figures and writes them as entry NAME of bench/results/floor_micro.json.
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]  # a mypyc build first
import floor_procs as f  # noqa: E402

from zinfer.client import protocol  # noqa: E402
from zinfer.client.protocol import Command, TensorRef  # noqa: E402
from zinfer.client.worker_protocol import decode_execute, decode_result, encode_execute  # noqa: E402
from zinfer.client.worker_records import Execute, ExecuteRequest, RequestResult, WorkerResult  # noqa: E402

N = 20_000


def warm_costs() -> dict[str, float]:
    """Microseconds per call of each step of one add0 request's way through the floor, warm."""
    fc = f.FloorClient(arrays=True)
    rid, msg = fc.request()
    infer = [bytes(x) for x in msg]
    got = protocol.decode_infer(infer)
    assert got is not None
    req = got.record

    def execute() -> Execute:
        return Execute(1, (ExecuteRequest(0, req.inputs, req.outputs or (), req.caller_id),))

    ex_msg = [bytes(x) for x in encode_execute(execute(), got.frames)]
    ex = decode_execute(ex_msg)
    assert ex is not None
    total = np.full((1, 1), 3.0, np.float32).tobytes()

    def result() -> Any:
        outs = (TensorRef("OUTPUT_SUM", "FP32", (1, 1), None, 0),)
        return WorkerResult(1, (RequestResult(0, outputs=outs),), timings=(1, 2, 3))

    res_msg = [bytes(x) for x in protocol.encode(Command.W_RESULT, result(), [total])]
    res = decode_result(res_msg)
    assert res is not None
    outs = list(res.record.results[0].outputs)

    def header() -> dict[str, Any]:
        return {"id": rid, "status": 0, "body": {"model": "add0", "version": 1, "outputs": outs}}

    reply = [bytes(x) for x in protocol.encode(Command.REPLY, header(), res.frames)]
    t_in = ex.record.requests[0].inputs
    steps = {
        "client: INFER from arrays": fc.request,
        "broker: decode INFER": lambda: protocol.decode_infer(infer),
        "broker: encode EXECUTE": lambda: encode_execute(execute(), got.frames),
        "worker: decode EXECUTE": lambda: decode_execute(ex_msg),
        "worker: arrays, add, bytes": lambda: (
            f._array(t_in[0], ex.frames) + f._array(t_in[1], ex.frames)
        ).tobytes(),
        "worker: encode RESULT": lambda: protocol.encode(Command.W_RESULT, result(), [total]),
        "broker: decode RESULT": lambda: decode_result(res_msg),
        "broker: encode REPLY": lambda: protocol.encode(Command.REPLY, header(), res.frames),
        # the floor client answers only an id it is waiting for (a set add, tens of ns, timed with it)
        "client: REPLY to array": lambda: (fc._waiting.add(rid), fc.reply(reply)),
    }
    out = {name: round(min(timeit.repeat(fn, number=N, repeat=3)) / N * 1e6, 2) for name, fn in steps.items()}
    out["total"] = round(sum(out.values()), 2)
    return out


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "latest"
    figures = warm_costs()
    print(json.dumps(figures, indent=2))
    results = Path(__file__).resolve().parent / "results" / "floor_micro.json"
    doc = json.loads(results.read_text()) if results.exists() else {}
    doc[name] = {"floor_compiled": not f.__file__.endswith(".py"), "us_per_call": figures}
    results.write_text(json.dumps(doc, indent=2) + "\n")
