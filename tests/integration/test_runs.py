"""Runs over a real server: a backlog of a model without dynamic batching goes to its instance several
requests to one EXECUTE (``broker.batching.runs``), and each request is still executed alone, answered
with its own result, counted as its own execution, and cancellable until its turn."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, wait_for
from zinfer.client import AsyncClient, Client
from zinfer.client.errors import Cancelled

pytestmark = pytest.mark.integration

CONFIG = """
name: "alone"
backend: "python"
max_batch_size: 8
input [ { name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "NTH" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# each request appends "ran TAG" to gate/log; a negative tag holds its execution until gate/release exists,
# asking is_cancelled() meanwhile (which reads the worker's socket); COUNT is how many requests the
# execute call got, NTH how many execute calls came before it
MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = os.path.join(os.path.dirname(__file__), "gate")
CALLS = [0]


class TritonPythonModel:
    def execute(self, requests):
        CALLS[0] += 1
        out = []
        for r in requests:
            tag = int(pb_utils.get_input_tensor_by_name(r, "TAG").as_numpy().reshape(-1)[0])
            with open(os.path.join(GATE, "log"), "a") as log:
                log.write(f"ran {tag}\\n")
            deadline = time.monotonic() + 60
            release = os.path.join(GATE, "release")
            while tag < 0 and not os.path.exists(release) and time.monotonic() < deadline:
                r.is_cancelled()
                time.sleep(0.002)
            count = np.full((1, 1), len(requests), np.int32)
            nth = np.full((1, 1), CALLS[0], np.int32)
            tensors = [pb_utils.Tensor("COUNT", count), pb_utils.Tensor("NTH", nth)]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    (root / "alone" / "1" / "gate").mkdir(parents=True)
    (root / "alone" / "config.pbtxt").write_text(CONFIG)
    (root / "alone" / "1" / "model.py").write_text(MODEL)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    s = start_server(repo, "--log-level", "DEBUG")  # DEBUG: the broker logs each run (event=run)
    try:
        yield s
    finally:
        (repo / "alone" / "1" / "gate" / "release").touch()  # a failed test leaves no execution held
        assert s.stop() == 0, s.log()


def _tag(t: int) -> dict[str, np.ndarray]:
    return {"TAG": np.full((1, 1), t, np.int32)}


def _ran(repo: Path) -> list[int]:
    log = repo / "alone" / "1" / "gate" / "log"
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def _runs(server: ServerProcess) -> list[int]:
    return [int(n) for n in re.findall(r"event=run model=alone executions=(\d+)", server.log())]


def _warm_up(server: ServerProcess) -> dict[str, int]:
    """A few lone requests, so the broker has timed one execution (runs are sized from it)."""
    with Client(server.url, timeout=30) as c:
        for t in range(3):
            c.infer("alone", _tag(1000 + t))
        stats: dict[str, int] = c.statistics("alone")["model_stats"][0]
    return stats


def test_a_backlog_goes_out_in_runs_and_each_request_is_still_executed_alone(
    server: ServerProcess, repo: Path
) -> None:
    before = _warm_up(server)
    runs_before = len(_runs(server))

    async def burst() -> list[tuple[int, int]]:
        async with AsyncClient(server.url, timeout=30) as c:  # 48 calls of one loop turn: one message
            results = await asyncio.gather(*(c.infer("alone", _tag(t)) for t in range(1, 49)))
            return [(int(r.as_numpy("COUNT")[0, 0]), int(r.as_numpy("NTH")[0, 0])) for r in results]

    answers = asyncio.run(burst())
    assert [count for count, _ in answers] == [1] * 48  # every execute call got one request
    assert len({nth for _, nth in answers}) == 48  # each its own call
    assert sorted(t for t in _ran(repo) if 0 < t < 1000) == list(range(1, 49))
    runs = _runs(server)[runs_before:]
    assert runs and max(runs) >= 2 and sum(runs) <= 48, runs  # fewer EXECUTEs than requests
    with Client(server.url, timeout=30) as c:
        after = c.statistics("alone")["model_stats"][0]
    assert after["execution_count"] - before["execution_count"] == 48
    assert after["inference_count"] - before["inference_count"] == 48
    compute = (
        after["inference_stats"]["compute_infer"]["count"]
        - before["inference_stats"]["compute_infer"]["count"]
    )
    assert compute == 48  # each execution's compute time counted once


def test_a_request_cancelled_while_its_run_waits_is_answered_cancelled_and_never_run(
    server: ServerProcess, repo: Path
) -> None:
    _warm_up(server)
    gate = repo / "alone" / "1" / "gate"
    (gate / "release").unlink(missing_ok=True)
    runs_before = len(_runs(server))
    ran_before = len(_ran(repo))
    cancels_before = server.log().count("event=request_cancelled")

    async def go() -> list[object]:
        async with AsyncClient(server.url, timeout=60) as c:
            holder = asyncio.ensure_future(c.infer("alone", _tag(-1)))
            await asyncio.to_thread(wait_for, lambda: -1 in _ran(repo), 30, "the holder to run")
            rest = [asyncio.ensure_future(c.infer("alone", _tag(t), request_id=f"r{t}")) for t in range(1, 9)]
            await asyncio.to_thread(wait_for, lambda: len(_runs(server)) > runs_before, 30, "a run to go out")
            assert await c.cancel("r2")
            # the worker reads the cancel while the holder still runs (is_cancelled reads its socket),
            # before the run it names has begun
            await asyncio.to_thread(
                wait_for,
                lambda: server.log().count("event=request_cancelled") > cancels_before,
                30,
                "the worker to take the cancel",
            )
            (gate / "release").touch()
            return list(await asyncio.gather(holder, *rest, return_exceptions=True))

    results = asyncio.run(go())
    assert isinstance(results[2], Cancelled), results[2]
    for i, r in enumerate(results):
        if i != 2:
            assert not isinstance(r, BaseException), (i, r)
    assert _ran(repo)[ran_before:] == [-1, 1, 3, 4, 5, 6, 7, 8]  # r2 never executed
