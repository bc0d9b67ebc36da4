"""A worker's run (``Execute.serial``, ``workers.batch.run_serial`` and ``request_batch.run_requests``): each
request of the EXECUTE is its own execution, one after the other, answered together; a failure or a cancel
touches its own request only."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import ProtocolError, Status
from zinfer.client.protocol import OutputRequest, TensorRef
from zinfer.client.worker_protocol import Execute, execute_from_wire, execute_to_wire, request_result_to_wire
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchRequest
from zinfer.workers.device import open_device
from zinfer.workers.loader import load_model
from zinfer.workers.model import AnyModel
from zinfer.workers.regions import RegionCache
from zinfer.workers.runners import run_once
from zinfer.workers.runtime import WorkerRuntime

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

TRITON = """
import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = []


class TritonPythonModel:
    def execute(self, requests):
        CALLS.append([float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0, 0]) for r in requests])
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0, 0] == 13:
                raise ValueError("thirteen")
            n = np.full(x.shape, len(requests), np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("N", n)],
                                                  parameters={"x": int(x[0, 0])}))
        return out
"""

PLAIN = """
import numpy as np

CALLS = []


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        x = inputs["X"]
        CALLS.append([float(v) for v in x.reshape(-1)])
        return {"Y": x * 2, "N": np.full(x.shape, x.shape[0], np.int32)}
"""


@pytest.fixture(autouse=True)
def _restore_import_state() -> Iterator[None]:
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def _load(tmp_path: Path, code: str) -> tuple[AnyModel, ModelConfig, list[list[float]]]:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(code))
    config = parse_model_config(CONFIG, source="test", model_name="m")
    model = load_model(config, version, open_device("cpu"), instance=0)
    calls = next(m.CALLS for n, m in sys.modules.items() if hasattr(m, "CALLS") and "model" in n)
    return model, config, calls


def _requests(values: list[float], rows: int = 1) -> tuple[list[BatchRequest], list[Any]]:
    frames: list[Any] = []
    reqs = []
    for i, v in enumerate(values):
        frames.append(np.full((rows, 1), v, np.float32).tobytes())
        x = TensorRef("X", "FP32", (rows, 1), frame=len(frames) - 1)
        reqs.append(BatchRequest(100 + i, (x,), (OutputRequest("Y"), OutputRequest("N")), f"r{i}"))
    return reqs, frames


def _answers(outcome: Any) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for r in outcome.results:
        wire = request_result_to_wire(r)
        if r.status == Status.OK:
            for t in wire["outputs"]:
                dtype = np.float32 if t["datatype"] == "FP32" else np.int32
                wire[t["name"]] = np.frombuffer(outcome.frames[t["frame"]], dtype).reshape(t["shape"])
        out[r.id] = wire
    return out


@pytest.mark.parametrize("code", [TRITON, PLAIN], ids=["triton", "plain"])
def test_each_request_of_a_run_is_its_own_execution(tmp_path: Path, code: str) -> None:
    model, config, calls = _load(tmp_path, code)
    reqs, frames = _requests([1.0, 2.0, 3.0, 4.0], rows=2)
    outcome = run_once(model, Signature.of(config), reqs, frames, RegionCache(), serial=True)
    assert (
        calls == [[1.0], [2.0], [3.0], [4.0]] if code is TRITON else calls == [[v, v] for v in (1, 2, 3, 4)]
    )
    got = _answers(outcome)
    assert list(got) == [100, 101, 102, 103]  # in order, one answer each
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        assert got[100 + i]["Y"].tolist() == [[2 * v], [2 * v]]  # its own outputs, frames renumbered
        assert got[100 + i]["N"].tolist() == [[1 if code is TRITON else 2]] * 2  # executed alone
    if code is TRITON:
        assert [got[100 + i]["parameters"] for i in range(4)] == [{"x": v} for v in (1, 2, 3, 4)]
    assert outcome.infer_ns > 0


def test_a_model_failure_in_a_run_fails_that_request_only(tmp_path: Path) -> None:
    model, config, calls = _load(tmp_path, TRITON)
    reqs, frames = _requests([1.0, 13.0, 3.0])
    got = _answers(run_once(model, Signature.of(config), reqs, frames, RegionCache(), serial=True))
    assert got[100]["Y"].tolist() == [[2.0]] and got[102]["Y"].tolist() == [[6.0]]
    assert got[101]["status"] == Status.INTERNAL and "thirteen" in got[101]["error"]
    assert calls == [[1.0], [13.0], [3.0]]


def test_a_request_cancelled_before_its_turn_is_not_run(tmp_path: Path) -> None:
    model, config, calls = _load(tmp_path, TRITON)
    reqs, frames = _requests([1.0, 2.0, 3.0])
    runtime = WorkerRuntime()  # the worker's: its cancel flags, read by the model's is_cancelled()
    cancel_flags = runtime.cancels
    cancel_flags.begin_batch(5, [r.id for r in reqs])
    polled: list[int] = []

    def poll() -> None:  # the worker's read of its socket: the W_CANCEL for 102 arrives during 101
        polled.append(len(calls))
        if len(calls) == 2:
            cancel_flags.cancel(5, 102)

    cancel_flags.set_poll(poll)
    got = _answers(run_once(model, Signature.of(config), reqs, frames, RegionCache(), serial=True,
                            runtime=runtime))  # fmt: skip
    assert calls == [[1.0], [2.0]]
    assert got[102]["status"] == Status.CANCELLED and got[101]["Y"].tolist() == [[4.0]]
    assert polled == [0, 1, 2]  # the socket is read before each execution


def test_serial_travels_on_the_wire_and_only_as_a_boolean() -> None:
    wire = execute_to_wire(Execute(3, (), serial=True))
    assert wire["serial"] is True and execute_from_wire(wire).serial
    assert "serial" not in execute_to_wire(Execute(3, ()))
    assert not execute_from_wire(execute_to_wire(Execute(3, ()))).serial
    with pytest.raises(ProtocolError, match="serial"):
        execute_from_wire({"batch": 3, "requests": [], "serial": 1})
