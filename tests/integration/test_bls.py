"""BLS: models calling other models through the broker, sync and async, native and Triton-shaped."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess
from zinfer.client import Client
from zinfer.client.errors import ServerError

pytestmark = pytest.mark.integration

NATIVE = """
import asyncio
import numpy as np
from zinfer.workers import bls


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        x = inputs["X"]
        if x[0, 0] < 0:  # ask a model that does not exist: the error is raised here
            bls.infer("no_such_model", {"INPUT0": x})
        if x[0, 0] == 0:  # call itself with no free instance
            bls.infer("native", {"X": x})
        once = bls.infer("identity", {"INPUT0": x})["OUTPUT0"]

        async def both():
            return await asyncio.gather(bls.infer_async("identity", {"INPUT0": x}),
                                        bls.infer_async("identity", {"INPUT0": 2 * x}))

        a, b = asyncio.run(both())
        return {"Y": once + a["OUTPUT0"] + b["OUTPUT0"]}
"""

TRITON_MISSING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            answer = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=["Y"],
                                               inputs=[pb_utils.get_input_tensor_by_name(r, "X")]).exec()
            assert answer.has_error()
            out.append(pb_utils.InferenceResponse(error=answer.error()))
        return out
"""


def _python_model(repo: Path, name: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture
def server(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> ServerProcess:
    repo = tmp_path / "models"
    for name in ("identity", "double", "bls_router"):
        shutil.copytree(MODELS / name, repo / name)
    _python_model(repo, "native", NATIVE)
    _python_model(repo, "triton_missing", TRITON_MISSING)
    return server_factory(repo)


def test_triton_style_router(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        short = np.arange(4, dtype=np.float32)
        long = np.arange(20, dtype=np.float32)
        np.testing.assert_array_equal(c.infer("bls_router", {"X": short}).as_numpy("Y"), short)
        np.testing.assert_array_equal(c.infer("bls_router", {"X": long}).as_numpy("Y"), 2 * long)


def test_native_sync_and_async_calls(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        x = np.array([[1.0, 2.0, 3.0]], np.float32)
        np.testing.assert_array_equal(c.infer("native", {"X": x}).as_numpy("Y"), x + x + 2 * x)


def test_errors_come_back_as_values_or_exceptions(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        with pytest.raises(ServerError, match="Request for unknown model: 'no_such_model' is not found"):
            c.infer("triton_missing", {"X": np.ones((1, 2), np.float32)})
        with pytest.raises(ServerError, match="Request for unknown model: 'no_such_model' is not found"):
            c.infer("native", {"X": -np.ones((1, 2), np.float32)})


def test_self_call_is_refused_not_deadlocked(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        with pytest.raises(ServerError, match="calls itself"):  # a deadlock would be RequestTimeout at 30 s
            c.infer("native", {"X": np.zeros((1, 2), np.float32)})
        x = np.ones((1, 2), np.float32)  # and the model still serves
        np.testing.assert_array_equal(c.infer("native", {"X": x}).as_numpy("Y"), 4 * x)
