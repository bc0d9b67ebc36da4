"""BLS request options of ``pb_utils.InferenceRequest``: ``timeout=``, a string ``correlation_id`` and the
sequence ``flags`` START/END, each through a real server, from Triton-style models written here.

``timeout`` is in microseconds, as in Triton's python backend README ("If the request times out, the request
will respond with an error"; 0, the default, is no timeout there, zinfer's 60 s bound on every BLS call
here): the caller gets a response whose error is
Triton's, ``Request timeout expired`` with code ``UNAVAILABLE`` (what Triton's core answers an expired
request with, and the text Triton's own BLS test looks for). In zinfer the timeout bounds the whole call,
queue and run: the callee sleeps past it, and its request is cancelled in the server.

``correlation_id`` (int or str, as Triton accepts since 24.03) and ``flags`` drive a stateful model
(``sequence_batching``) that keeps a running sum per ``request.correlation_id()``; the int id 7 and the
str id "7" are two sequences. A request of an ended sequence without START is refused as zinfer's
sequence batcher refuses it from any client: INVALID_ARG (Triton's code for it too; Triton's text says
"must specify the START flag on the first request of the sequence").
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all, wait_for
from zinfer.client import Client

pytestmark = pytest.mark.integration

UNAVAILABLE, INVALID_ARG = 4, 3  # pb_utils.TritonError codes

SLOW = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(args["model_config"])

    def execute(self, requests):
        out = []
        for request in requests:
            ms = int(pb_utils.get_input_tensor_by_name(request, "SLEEP_MS").as_numpy().reshape(-1)[0])
            began = time.monotonic()
            deadline = began + ms / 1000
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.005)
            slept = int((time.monotonic() - began) * 1000)
            cancelled = request.is_cancelled()
            pb_utils.Logger.log_info(f"{self.name}: slept_ms={slept} of={ms} cancelled={cancelled}")
            response = pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT_MS", np.array([slept], np.int32))])
            if self.decoupled:
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                request.get_response_sender().send(response, flags=final)
            else:
                out.append(response)
        return out if not self.decoupled else None
"""

TIMEOUT_CALLER = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]
            call = pb_utils.InferenceRequest(
                model_name="slow", requested_output_names=["SLEPT_MS"], timeout=int(get("TIMEOUT_US")),
                inputs=[pb_utils.Tensor("SLEEP_MS", np.array([get("SLEEP_MS")], np.int32))])
            began = time.monotonic()
            mode = json.loads(request.parameters())["mode"]
            if mode == "async_exec":
                answer = await call.async_exec()
            elif mode == "decoupled":
                call = pb_utils.InferenceRequest(
                    model_name="slow_stream", requested_output_names=["SLEPT_MS"], inputs=call.inputs(),
                    timeout=call.timeout())
                answer = next(call.exec(decoupled=True))
            else:
                answer = call.exec()
            result = {"elapsed_s": time.monotonic() - began}
            if answer.has_error():
                result.update(code=answer.error().code(), message=answer.error().message(),
                              outputs=len(answer.output_tensors()))
            else:
                slept = pb_utils.get_output_tensor_by_name(answer, "SLEPT_MS").as_numpy()
                result.update(slept_ms=int(slept[0]))
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("RESULT", np.array([json.dumps(result)], dtype=object))]))
        return out
"""

ACCUMULATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}  # request.correlation_id() -> running sum, from START until END

    def execute(self, requests):
        out = []
        for request in requests:
            cid, flags = request.correlation_id(), request.flags()
            start = bool(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            end = bool(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0])
            if start != bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) or \\
                    end != bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END):
                raise pb_utils.TritonModelException(f"controls {start}/{end} disagree with flags {flags}")
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            if start:
                self.sums[cid] = 0
            elif cid not in self.sums:
                out.append(pb_utils.InferenceResponse(error=f"no state for sequence {cid!r}"))
                continue
            total = self.sums.pop(cid) + value
            if not end:
                self.sums[cid] = total
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32)),
                pb_utils.Tensor("CORRID", np.array([[repr(cid)]], dtype=object)),
                pb_utils.Tensor("FLAGS", np.array([[flags]], np.int32)),
            ]))
        return out
"""

SEQUENCE_CALLER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            steps = json.loads(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy().reshape(-1)[0])
            results = []
            for cid, value, start, end in steps:
                answer = pb_utils.InferenceRequest(
                    model_name="accumulate", requested_output_names=["OUTPUT", "CORRID", "FLAGS"],
                    inputs=[pb_utils.Tensor("INPUT", np.array([[value]], np.int32))],
                    correlation_id=cid, flags=(START if start else 0) | (END if end else 0)).exec()
                if answer.has_error():
                    results.append({"code": answer.error().code(), "message": answer.error().message()})
                    continue
                get = lambda name: pb_utils.get_output_tensor_by_name(answer, name).as_numpy().reshape(-1)[0]
                results.append({"sum": int(get("OUTPUT")), "corrid": get("CORRID").decode(),
                                "flags": int(get("FLAGS"))})
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("RESULT", np.array([json.dumps(results)], dtype=object))]))
        return out
"""

CONFIGS = {
    "slow": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "SLEEP_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SLEPT_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "slow_stream": """
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "SLEEP_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SLEPT_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "timeout_caller": """
        backend: "python"
        max_batch_size: 0
        input [
          { name: "SLEEP_MS" data_type: TYPE_INT32 dims: [ 1 ] },
          { name: "TIMEOUT_US" data_type: TYPE_INT64 dims: [ 1 ] }
        ]
        output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """,
    "accumulate": """
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [
          { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
          { name: "CORRID" data_type: TYPE_STRING dims: [ 1 ] },
          { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }
        ]
        sequence_batching {
          max_sequence_idle_microseconds: 10000000
          direct { }
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }
          ]
        }
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "sequence_caller": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "STEPS" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
    """,
}
CODE = {
    "slow": SLOW,
    "slow_stream": SLOW,
    "timeout_caller": TIMEOUT_CALLER,
    "accumulate": ACCUMULATE,
    "sequence_caller": SEQUENCE_CALLER,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("bls_options")
    for name, config in CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n' + textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(CODE[name])
    s = start_server(repo)
    try:
        yield s
    finally:
        stop_all([s])


def _result(client: Client, model: str, inputs: dict[str, Any], **options: Any) -> Any:
    text = client.infer(model, inputs, client_timeout=30, **options).as_numpy("RESULT").reshape(-1)[0]
    return json.loads(text)


def _timed_call(client: Client, sleep_ms: int, timeout_us: int, mode: str) -> dict[str, Any]:
    inputs = {"SLEEP_MS": np.array([sleep_ms], np.int32), "TIMEOUT_US": np.array([timeout_us], np.int64)}
    result: dict[str, Any] = _result(client, "timeout_caller", inputs, parameters={"mode": mode})
    return result


@pytest.mark.parametrize("mode", ["exec", "async_exec", "decoupled"])
def test_a_bls_timeout_in_microseconds_ends_in_triton_s_timeout_error(
    server: ServerProcess, mode: str
) -> None:
    callee = "slow_stream" if mode == "decoupled" else "slow"
    withdrawn = f"{callee}: slept_ms="
    before = server.log().count(withdrawn)
    with Client(server.url, timeout=30) as c:
        # 0.3 s for a callee that would take 10 s: the error comes after the timeout, long before the callee
        # would have answered (a timeout read as milliseconds or seconds would wait for the answer).
        expired = _timed_call(c, sleep_ms=10_000, timeout_us=300_000, mode=mode)
        assert {k: expired.get(k) for k in ("code", "message", "outputs")} == {
            "code": UNAVAILABLE,
            "message": "Request timeout expired",
            "outputs": 0,
        }, (mode, expired)
        assert 0.3 <= expired["elapsed_s"] < 5.0, (mode, expired)
        # the timed-out call was withdrawn: the callee saw the cancel and stopped well before its 10 s
        wait_for(lambda: server.log().count(withdrawn) > before, 10, f"{callee} to end the timed-out call")
        last = [line for line in server.log().splitlines() if withdrawn in line][-1]
        assert "of=10000 cancelled=True" in last and int(last.split("slept_ms=")[1].split()[0]) < 5000, last

        generous = _timed_call(c, sleep_ms=200, timeout_us=30_000_000, mode=mode)  # 30 s
        assert "code" not in generous and generous["slept_ms"] >= 200, (mode, generous)
        unbounded = _timed_call(c, sleep_ms=200, timeout_us=0, mode=mode)  # 0: the default
        assert "code" not in unbounded and unbounded["slept_ms"] >= 200, (mode, unbounded)


def _steps(client: Client, steps: list[tuple[int | str, int, bool, bool]]) -> list[dict[str, Any]]:
    text = json.dumps(steps)
    result: list[dict[str, Any]] = _result(
        client, "sequence_caller", {"STEPS": np.array([text], dtype=object)}
    )
    return result


def test_a_string_correlation_id_with_start_and_end_gets_the_running_sums(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        got = _steps(c, [("seq-a", 1, True, False), ("seq-a", 2, False, False), ("seq-a", 3, False, True)])
    assert got == [
        {"sum": 1, "corrid": "'seq-a'", "flags": 1},  # the callee's correlation_id() is the str itself
        {"sum": 3, "corrid": "'seq-a'", "flags": 0},
        {"sum": 6, "corrid": "'seq-a'", "flags": 2},
    ]


def test_interleaved_int_and_str_sequences_stay_separate(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        got = _steps(c, [
            (7, 1, True, False), ("7", 10, True, False),  # the int 7 and the str "7" are two sequences
            (7, 2, False, False), ("7", 20, False, False),
            (7, 3, False, True), ("7", 30, False, True),
        ])  # fmt: skip
    assert [(r["sum"], r["corrid"], r["flags"]) for r in got] == [
        (1, "7", 1),
        (10, "'7'", 1),
        (3, "7", 0),
        (30, "'7'", 0),
        (6, "7", 2),
        (60, "'7'", 2),
    ]


def test_a_request_after_end_without_start_is_refused_as_invalid(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        got = _steps(c, [
            ("seq-b", 5, True, True),  # START | END: a sequence of one request
            ("seq-b", 1, False, False),  # after END, without START
            ("never-started", 1, False, False),
            ("seq-b", 2, True, False), ("seq-b", 4, False, True),  # the id may start over, from 0
        ])  # fmt: skip
    assert got == [
        {"sum": 5, "corrid": "'seq-b'", "flags": 3},
        {
            "code": INVALID_ARG,
            "message": "InvalidArgument: inference request for sequence seq-b to model 'accumulate' "
            "must specify the START flag on the first request of the sequence",
        },
        {
            "code": INVALID_ARG,
            "message": "InvalidArgument: inference request for sequence never-started to model 'accumulate' "
            "must specify the START flag on the first request of the sequence",
        },
        {"sum": 2, "corrid": "'seq-b'", "flags": 1},
        {"sum": 6, "corrid": "'seq-b'", "flags": 2},
    ]
