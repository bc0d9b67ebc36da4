"""The smaller parts of Triton's python-backend API over a real server, with a model written for this test:
error codes to client exceptions, request and response parameters, the logger's levels, Triton's
instance names, relative imports inside the version folder, DLPack export of (read-only) inputs, and
answering through response senders without being decoupled."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all, wait_for
from zinfer.client import Client
from zinfer.client.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    ServerError,
    Unavailable,
    UnknownError,
    Unsupported,
)

pytestmark = pytest.mark.integration

HELPER = "SCALE = 3.0\n"

PROBE = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

from .helper import SCALE  # a relative import: the version folder is the model's package


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"probe: instance={args['model_instance_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            first = float(x.as_numpy()[0])
            if first < 0:  # -1 - code: an error response with that TritonError code
                code = int(-first) - 1
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"code {code}", code)))
                continue
            logger = pb_utils.Logger
            logger.log("probe-warning", logger.WARNING)
            logger.log("probe-error", pb_utils.LogLevel.ERROR)
            logger.log_info("probe-info")
            # the input is the client's memory, read-only: DLPack export still works
            copy = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
            y = pb_utils.Tensor("Y", (copy.as_numpy() * SCALE).astype(np.float32))
            seen = {
                "parameters": json.loads(request.parameters()),
                "outputs": request.requested_output_names(),
                "model_name": request.model_name,
                "flags": request.flags(),
                "correlation_id": request.correlation_id(),
                "is_cpu": x.is_cpu(),
                "name": x.name(),
                "request_id": request.request_id(),
            }
            info = pb_utils.Tensor("INFO", np.array([json.dumps(seen).encode()], dtype=np.object_))
            parameters = {"scale": int(SCALE), "tag": "probe"}
            responses.append(pb_utils.InferenceResponse([y, info], parameters=parameters))
        return responses
"""

VIA_SENDER = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().copy()
            sender = request.get_response_sender()
            threading.Thread(target=self.answer, args=(x, sender)).start()
        return None  # not decoupled, yet answering through the senders, one response each

    def answer(self, x, sender):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_warn(f"via_sender: second response refused: {exc}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

LATE_SENDER = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0] < 0:
            return None  # lets go of its requests without a sender taken: no response can come
        # keeps the requests and asks for their senders only after execute returned
        threading.Thread(target=self.answer, args=(list(requests),)).start()
        return None

    def answer(self, requests):
        time.sleep(0.2)
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(model_name="probe", requested_output_names=["Y", "INFO"],
                                             inputs=[x], parameters={"via": "bls"}, request_id="inner")
            answer = call.exec()
            if answer.has_error():
                out.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                out.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return out
"""

IO = """max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("api") / "models"
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "config.pbtxt").write_text(
        'name: "probe"\nbackend: "python"\n' + IO
        + "instance_group [ { kind: KIND_CPU count: 1 }, { kind: KIND_CPU count: 2 } ]\n"
    )  # fmt: skip
    (repo / "probe" / "1" / "model.py").write_text(PROBE)
    (repo / "probe" / "1" / "helper.py").write_text(HELPER)
    (repo / "via_sender" / "1").mkdir(parents=True)
    (repo / "via_sender" / "config.pbtxt").write_text('name: "via_sender"\nbackend: "python"\n' + IO)
    (repo / "via_sender" / "1" / "model.py").write_text(VIA_SENDER)
    (repo / "late_sender" / "1").mkdir(parents=True)
    (repo / "late_sender" / "config.pbtxt").write_text('name: "late_sender"\nbackend: "python"\n' + IO)
    (repo / "late_sender" / "1" / "model.py").write_text(LATE_SENDER)
    (repo / "caller" / "1").mkdir(parents=True)
    (repo / "caller" / "config.pbtxt").write_text('name: "caller"\nbackend: "python"\n' + IO)
    (repo / "caller" / "1" / "model.py").write_text(CALLER)
    s = start_server(repo)
    yield s
    stop_all([s])


@pytest.mark.parametrize(
    "code, error",
    [
        (0, UnknownError),  # UNKNOWN: an InternalError that the front door answers as gRPC UNKNOWN
        (1, InternalError),  # INTERNAL
        (2, NotFound),
        (3, InvalidArgument),
        (4, Unavailable),
        (5, Unsupported),
        (6, AlreadyExists),
        (7, Cancelled),
    ],
)
def test_triton_error_codes_reach_the_client_as_zinfer_errors(
    server: ServerProcess, code: int, error: type[ServerError]
) -> None:
    with Client(server.url, timeout=30) as c:
        with pytest.raises(error, match=f"code {code}") as caught:
            c.infer("probe", {"X": np.array([-1.0 - code], np.float32)})
        assert type(caught.value) is error


def test_request_and_response_api(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        result = c.infer("probe", {"X": np.array([1.0, 2.0], np.float32)}, request_id="r-7",
                         parameters={"temperature": 0.5, "mode": "fast", "greedy": True, "n": 3})  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("Y"), [3.0, 6.0])
    seen = json.loads(result.as_numpy("INFO")[0])
    assert seen == {
        "parameters": {"temperature": 0.5, "mode": "fast", "greedy": True, "n": 3},
        "outputs": ["Y", "INFO"],
        "model_name": "probe",
        "flags": 0,
        "correlation_id": 0,
        "is_cpu": True,
        "name": "X",
        "request_id": "r-7",
    }
    assert result.parameters == {"scale": 3, "tag": "probe"}
    assert result.get_response()["parameters"] == {"scale": 3, "tag": "probe"}


def test_logger_levels_reach_the_log(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        c.infer("probe", {"X": np.array([1.0], np.float32)})
    wait_for(lambda: "probe-info" in server.log(), 10, "the model's log lines")
    lines = server.log().splitlines()
    assert any("level=WARNING" in line and "probe-warning" in line for line in lines)
    assert any("level=ERROR" in line and "probe-error" in line for line in lines)
    assert any("level=INFO" in line and "probe-info" in line for line in lines)


def test_instance_names_follow_triton(server: ServerProcess) -> None:
    names = set(re.findall(r"probe: instance=(\S+)", server.log()))
    assert names == {"probe_0_0", "probe_1_0", "probe_1_1"}


def test_a_model_that_is_not_decoupled_may_answer_through_its_senders(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        result = c.infer("via_sender", {"X": np.array([1.0, 5.0], np.float32)}, outputs=["Y"])
    np.testing.assert_array_equal(result.as_numpy("Y"), [2.0, 6.0])
    wait_for(lambda: "cannot send more than one response" in server.log(), 10, "the refusal")


def test_a_sender_asked_for_after_execute_returned_still_answers(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        result = c.infer("late_sender", {"X": np.array([1.0, 5.0], np.float32)}, outputs=["Y"])
        np.testing.assert_array_equal(result.as_numpy("Y"), [10.0, 50.0])
        # requests let go of with no sender taken and no response returned: a clear error, not a hang
        with pytest.raises(InternalError, match="returned None"):
            c.infer("late_sender", {"X": np.array([-1.0], np.float32)}, outputs=["Y"])
        result = c.infer("late_sender", {"X": np.array([2.0], np.float32)}, outputs=["Y"])
        np.testing.assert_array_equal(result.as_numpy("Y"), [20.0])


def test_bls_passes_its_parameters_and_error_codes_on(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        result = c.infer("caller", {"X": np.array([2.0], np.float32)})
        seen = json.loads(result.as_numpy("INFO")[0])
        assert seen["parameters"] == {"via": "bls"} and seen["request_id"] == "inner"
        np.testing.assert_array_equal(result.as_numpy("Y"), [6.0])
        with pytest.raises(NotFound, match="code 2"):  # the callee's NOT_FOUND, through the caller
            c.infer("caller", {"X": np.array([-3.0], np.float32)})
