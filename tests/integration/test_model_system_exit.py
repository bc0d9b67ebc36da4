"""A model whose ``execute`` calls ``sys.exit`` fails that batch with the reason, as under Triton's python
backend stub, and its worker serves on: the next request is answered by the same process, not refused while
a new worker starts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import start_server, stop_all
from zinfer.client import Client
from zinfer.client.errors import InternalError

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
"""

TRITON_STYLE = """
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        if x[0] < 0:
            sys.exit(3)
        pid = np.array([os.getpid()], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""


ASYNC_STYLE = TRITON_STYLE.replace("    def execute(", "    async def execute(")
DECOUPLED_STYLE = """
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if x[0] < 0:
                sys.exit(3)
            pid = np.array([os.getpid()], np.int64)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.mark.parametrize("style", ["sync", "async"])
def test_sys_exit_in_execute_fails_the_batch_and_the_worker_serves_on(tmp_path: Path, style: str) -> None:
    repo = tmp_path / "models"
    (repo / "quits" / "1").mkdir(parents=True)
    (repo / "quits" / "config.pbtxt").write_text(CONFIG.format(name="quits"))
    code = TRITON_STYLE if style == "sync" else ASYNC_STYLE
    (repo / "quits" / "1" / "model.py").write_text(textwrap.dedent(code))
    server = start_server(repo, runtime_dir=tmp_path / "run")
    try:
        with Client(server.url, timeout=30) as c:
            first = int(c.infer("quits", {"IN": np.array([1.0], np.float32)}).as_numpy("PID")[0])
            with pytest.raises(InternalError, match="SystemExit: 3"):
                c.infer("quits", {"IN": np.array([-1.0], np.float32)})
            again = int(c.infer("quits", {"IN": np.array([2.0], np.float32)}).as_numpy("PID")[0])
        assert again == first, "the worker was replaced"
        assert "event=worker_exited" not in server.log() and "exited with code" not in server.log()
    finally:
        stop_all([server])


def test_sys_exit_in_a_decoupled_execute_ends_the_stream_with_the_reason(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    (repo / "quits" / "1").mkdir(parents=True)
    config = CONFIG.format(name="quits") + "model_transaction_policy { decoupled: true }\n"
    (repo / "quits" / "config.pbtxt").write_text(config)
    (repo / "quits" / "1" / "model.py").write_text(textwrap.dedent(DECOUPLED_STYLE))
    server = start_server(repo, runtime_dir=tmp_path / "run")
    try:
        with Client(server.url, timeout=30) as c:
            first = [r.as_numpy("PID") for r in c.stream("quits", {"IN": np.array([1.0], np.float32)})]
            with pytest.raises(InternalError, match="SystemExit: 3"):
                list(c.stream("quits", {"IN": np.array([-1.0], np.float32)}))
            again = [r.as_numpy("PID") for r in c.stream("quits", {"IN": np.array([2.0], np.float32)})]
        assert int(again[0][0]) == int(first[0][0]), "the worker was replaced"
        assert "event=worker_exited" not in server.log() and "exited with code" not in server.log()
    finally:
        stop_all([server])
