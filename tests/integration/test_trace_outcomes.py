"""Traces of every outcome and level TENSORS on a real ``zinfer serve``: a request that ran, one answered
from the response cache, one the model failed, one cancelled in the queue; their tensors in Triton's form."""

from __future__ import annotations

import asyncio
import json
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TRITON_TIMING, ServerProcess
from tests.integration.test_tracing import ENSEMBLE_ORDER, ORDER, traces
from zinfer.broker.trace_tensors import MAX_ELEMENTS
from zinfer.client import AsyncClient, Client
from zinfer.client.errors import ClientError, ServerError
from zinfer.client.protocol import TRACE_ID

pytestmark = pytest.mark.integration

DOUBLER = """
    class Model:
        def execute(self, inputs):
            x = inputs["X"]
            if (x == 9).any():
                raise ValueError("nine is not a number I like")
            return {"Y": x * 2 + 1, "Z": -x}
"""

SLOW = """
    import time

    class Model:
        def execute(self, inputs):
            time.sleep(0.5)
            return {"Y": inputs["X"] + 1}
"""


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}\n')
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    _model(
        repo,
        "dbl",
        'max_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, '
        '{ name: "Z" data_type: TYPE_FP32 dims: [ -1 ] } ]\nresponse_cache { enable: true }',
        DOUBLER,
    )
    _model(
        repo,
        "slow",
        'max_batch_size: 0\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
        SLOW,
    )
    _model(repo, "held", 'max_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
           "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 20000000 }\n"
           + TRITON_TIMING, SLOW)  # fmt: skip
    return repo


async def _cancel(url: str) -> None:
    async with AsyncClient(url, timeout=30) as c:
        x = np.ones(1, np.float32)
        with pytest.raises((ClientError, ServerError)):  # held in the queue for a batch of 8: cancelled there
            await c.infer("held", {"X": x.reshape(1, 1)}, request_id="queued", client_timeout=0.3)
        with pytest.raises((ClientError, ServerError)):  # cancelled while the model runs it
            await c.infer("slow", {"X": x}, request_id="running", client_timeout=0.2)
        await c.infer("slow", {"X": x}, request_id="after")  # the instance is free again


def _by_rid(path: Path) -> dict[str, dict[str, Any]]:
    return {t["request_id"]: t for t in traces(json.loads(path.read_text()), strict=False).values()}


def _tensors(t: dict[str, Any], activity: str) -> dict[str, dict[str, Any]]:
    return {e["tensor"]["name"]: e["tensor"] for e in t["tensors"] if e["activity"] == activity}


def test_every_outcome_is_traced_with_its_tensors(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    path = tmp_path / "trace.json"
    flags = (f"triton,file={path}", "level=TIMESTAMPS", "level=TENSORS", "rate=1")
    server = server_factory(_repo(tmp_path), "--cache-bytes", "1000000",
                            *[a for f in flags for a in ("--trace-config", f)])  # fmt: skip
    small = np.array([[1, 2, 3, 4]], np.float32)
    big = np.arange(10, 2058, dtype=np.float32).reshape(1, 2048)  # no 9: the model refuses nines
    with Client(server.url, timeout=30) as c:
        ok = c.infer("dbl", {"X": small}, request_id="ok")
        token = ok.parameters[TRACE_ID]
        assert isinstance(token, str) and len(token) == 16  # a traced reply names its trace for the door
        assert TRACE_ID in c.infer("dbl", {"X": small}, request_id="hit").parameters
        with pytest.raises(ServerError, match="nine"):
            c.infer("dbl", {"X": np.array([[9, 0, 0, 0]], np.float32)}, request_id="err")
        assert c.infer("dbl", {"X": big}, request_id="big").as_numpy("Z")[0, -1] == -2057
    asyncio.run(_cancel(server.url))
    assert server.stop(signal.SIGTERM) == 0
    got = _by_rid(path)
    assert {"ok", "hit", "err", "big", "running", "queued", "after"} <= set(got)

    ok_t = got["ok"]
    assert [s["name"] for s in ok_t["timestamps"]] == ORDER and "status" not in ok_t["zinfer"]
    want_in = {"name": "X", "data": "1,2,3,4", "shape": "1,4", "dtype": "FP32"}
    assert _tensors(ok_t, "TENSOR_QUEUE_INPUT") == {"X": want_in}
    assert _tensors(ok_t, "TENSOR_BACKEND_INPUT") == {"X": want_in}
    outs = _tensors(ok_t, "TENSOR_BACKEND_OUTPUT")
    assert outs["Y"]["data"] == "3,5,7,9" and outs["Y"]["shape"] == "1,4"
    assert outs["Z"]["data"] == "-1,-2,-3,-4"

    hit = got["hit"]  # answered from the cache: no batch, no backend tensors
    assert [s["name"] for s in hit["timestamps"]] == ENSEMBLE_ORDER and hit["zinfer"]["cache"] == "hit"
    assert set(_tensors(hit, "TENSOR_QUEUE_INPUT")) == {"X"} and not _tensors(hit, "TENSOR_BACKEND_OUTPUT")

    err = got["err"]  # the model failed it: it ran (compute stamps), no outputs
    assert [s["name"] for s in err["timestamps"]] == ORDER and err["zinfer"]["status"] != "OK"
    assert not _tensors(err, "TENSOR_BACKEND_OUTPUT")

    big_t = got["big"]  # bounded: the first MAX_ELEMENTS elements, the full count said
    x = _tensors(big_t, "TENSOR_QUEUE_INPUT")["X"]
    assert x["truncated"] is True and x["elements"] == 2048 and x["shape"] == "1,2048"
    assert len(x["data"].split(",")) == MAX_ELEMENTS and x["data"].startswith("10,11,12,")
    z = _tensors(big_t, "TENSOR_BACKEND_OUTPUT")["Z"]
    assert z["truncated"] is True and z["data"].split(",")[:3] == ["-10", "-11", "-12"]

    queued = got["queued"]  # cancelled while queued: Triton's request stamps, no compute
    assert [s["name"] for s in queued["timestamps"]] == ENSEMBLE_ORDER
    assert queued["zinfer"]["status"] == "CANCELLED"
    running = got["running"]  # cancelled while it ran: compute stamps, its result discarded
    assert [s["name"] for s in running["timestamps"]] == ORDER
    assert running["zinfer"]["status"] == "CANCELLED" and not _tensors(running, "TENSOR_BACKEND_OUTPUT")
