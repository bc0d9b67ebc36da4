"""What Triton's python-backend qa tests check, with zinfer's own models, over the real tritonclient.

``test_triton_qa`` runs Triton's tests themselves where a copy of Triton's repository is at hand; this module
needs none (CI has no network): each test here exercises one behaviour those tests found missing, through
both front doors and the native client: outputs unlike the config passed on, response parameters and
Triton's checks of them, async batches side by side (decoupled or not), error codes and texts, the
``triton_grpc_error`` stream header and ``ResponseIterator.cancel()``.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all, wait_for

pytestmark = pytest.mark.integration
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.frontdoor_helpers import free_port, wait_grpc, wait_http  # noqa: E402
from zinfer.client import Client  # noqa: E402

PASS_THROUGH = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            # INT64 for a TYPE_INT32 output, and one value more than the config's dims say
            y = np.concatenate([x.reshape(-1), [7]]).astype(np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""

PARAMETERS = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "P").as_numpy().reshape(-1)[0].decode()
            params = json.loads(text)
            if isinstance(params, dict):
                params = {int(k) if k.isdigit() else k: v for k, v in params.items()}
            try:
                y = pb_utils.Tensor("Y", np.array([[1]], np.int32))
                out.append(pb_utils.InferenceResponse([y], parameters=params))
            except Exception as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                out.append(pb_utils.InferenceResponse(error=error))
        return out
"""

ASYNC_SLEEP = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        senders = [r.get_response_sender() for r in requests]
        await asyncio.sleep(1.0)
        for sender in senders:
            y = pb_utils.Tensor("Y", np.array([[1]], np.int32))
            sender.send(pb_utils.InferenceResponse([y]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

ASYNC_ANSWERS = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):  # not decoupled: returns its responses
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any(int(x.reshape(-1)[0]) < 0 for x in xs):
            await asyncio.sleep(0.5)
            raise ValueError("X cannot be negative")
        await asyncio.sleep(1.0)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 10).astype(np.int32))]) for x in xs]
"""

ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        kind = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy().reshape(-1)[0])
        if kind == 0:
            error = pb_utils.TritonError("unknown kind", pb_utils.TritonError.UNKNOWN)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if kind == 1:
            undefined_name_here
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[kind]], np.int32))])
                for _ in requests]
"""

DECOUPLED_ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        kind = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy().reshape(-1)[0])
        if kind == 0:
            return [pb_utils.InferenceResponse([])]  # a decoupled model must return None
        for r in requests:
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[1]], np.int32))]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("second one fails")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

UNTIL_CANCELLED = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,), daemon=True).start()
        return None

    def run(self, request):
        sender = request.get_response_sender()
        for _ in range(200):  # 10 s at most
            if request.is_cancelled():
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("stopped", 7)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[1]], np.int32))]))
            time.sleep(0.05)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

IGNORES_CANCEL = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,), daemon=True).start()
        return None

    def run(self, request):  # ten responses, cancelled or not
        sender = request.get_response_sender()
        for _ in range(10):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[1]], np.int32))]))
            time.sleep(0.05)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CANCELLER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            callee = "until_cancelled" if int(x.as_numpy().reshape(-1)[0]) == 1 else "ignores_cancel"
            stream = pb_utils.InferenceRequest(model_name=callee, inputs=[x],
                                               requested_output_names=["Y"]).exec(decoupled=True)
            total, cancelled = 0, False
            for response in stream:
                if response.has_error():
                    cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                    break
                if not response.output_tensors():
                    break
                total += int(pb_utils.get_output_tensor_by_name(response, "Y").as_numpy().sum())
                if total >= 5:
                    stream.cancel()
            y = np.array([[total * 10 + int(cancelled)]], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""

SENT_STANDS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        kind = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy().reshape(-1)[0])
        sender = requests[0].get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[1]], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if kind == 0 else 0)
        if kind == 0:  # the sender is closed: Triton discards the returned response
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[2]], np.int32))])]
        sender.send(pb_utils.InferenceResponse([]))  # a second response: raises, after the first went out
        return None
"""

READINESS = """
import pathlib
import numpy as np
import triton_python_backend_utils as pb_utils

FLAG = pathlib.Path(__file__).parent / "ready_flag"

class TritonPythonModel:
    def execute(self, requests):
        y = pb_utils.Tensor("Y", np.array([[3]], np.int32))
        return [pb_utils.InferenceResponse([y]) for _ in requests]

    def is_ready(self):
        text = FLAG.read_text().strip() if FLAG.exists() else "false"
        if text == "raise":
            raise RuntimeError("not today")
        return {"true": True, "false": False}.get(text, text)  # anything else: not a bool
"""

SLOW_READY = """
import pathlib
import time
import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = pathlib.Path(__file__).parent / "calls"

class TritonPythonModel:
    def execute(self, requests):
        y = pb_utils.Tensor("Y", np.array([[4]], np.int32))
        return [pb_utils.InferenceResponse([y]) for _ in requests]

    def is_ready(self):  # longer than Triton's 5 s bound on a readiness query
        with CALLS.open("a") as f:
            f.write("start\\n")
        time.sleep(6.5)
        with CALLS.open("a") as f:
            f.write("end\\n")
        return True
"""

ARGV = """
import sys
import unittest
import numpy as np
import triton_python_backend_utils as pb_utils

class Check(unittest.TestCase):
    def test_nothing(self):
        pass

class TritonPythonModel:
    def execute(self, requests):
        result = unittest.main(module=__name__, exit=False)  # parses sys.argv, as Triton's qa models do
        y = np.array([[len(sys.argv) * 10 + int(result.result.wasSuccessful())]], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]) for _ in requests]
"""

IO = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PARAMS_IO = IO.replace('name: "X" data_type: TYPE_INT32', 'name: "P" data_type: TYPE_STRING')
DECOUPLED = "model_transaction_policy { decoupled: true }\n"

MODELS = {
    "pass_through": (PASS_THROUGH, IO),
    "parameters": (PARAMETERS, PARAMS_IO),
    "async_sleep": (ASYNC_SLEEP, IO + DECOUPLED),
    "async_answers": (ASYNC_ANSWERS, IO),
    "errors": (ERRORS, IO),
    "decoupled_errors": (DECOUPLED_ERRORS, IO + DECOUPLED),
    "until_cancelled": (UNTIL_CANCELLED, IO + DECOUPLED),
    "ignores_cancel": (IGNORES_CANCEL, IO + DECOUPLED),
    "canceller": (CANCELLER, IO),
    "sent_stands": (SENT_STANDS, IO),
    "readiness": (READINESS, IO),
    "slow_ready": (SLOW_READY, IO),
    "argv": (ARGV, IO),
}


Served = tuple[ServerProcess, str, str]
REPOSITORY: dict[str, Path] = {}  # the served fixture's model repository


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo: Path = tmp_path_factory.mktemp("qa") / "models"
    REPOSITORY["served"] = repo
    for name, (code, io) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{io}')
        (repo / name / "1" / "model.py").write_text(code)
    http_url, grpc_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--http", http_url, "--grpc", grpc_url)
    try:
        wait_http(http_url)
        wait_grpc(grpc_url).close()
        yield server, http_url, grpc_url
    finally:
        stop_all([server])


def _x(value: int, module: Any = grpcclient) -> list[Any]:
    x = module.InferInput("X", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], np.int32))
    return [x]


def _p(params: Any, module: Any = grpcclient) -> list[Any]:
    p = module.InferInput("P", [1, 1], "BYTES")
    p.set_data_from_numpy(np.array([[json.dumps(params).encode()]], dtype=np.object_))
    return [p]


def _grpc_params(result: Any) -> dict[str, Any]:
    out = {}
    for key, value in result.get_response().parameters.items():
        out[key] = getattr(value, value.WhichOneof("parameter_choice"))
    return out


def test_an_output_unlike_its_config_is_passed_on_and_logged_once(served: Served) -> None:
    server, http_url, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        for value in (3, 4):
            result = client.infer("pass_through", _x(value))
            y = result.as_numpy("Y")
            assert y.dtype == np.int64 and y.tolist() == [value, 7]  # as the model made it
            assert result.get_output("Y").datatype == "INT64"
    result = httpclient.InferenceServerClient(http_url).infer("pass_through", _x(5, httpclient))
    assert result.as_numpy("Y").tolist() == [5, 7]
    wait_for(lambda: "event=output_unlike_config model=pass_through" in server.log(), 10, "the log line")
    assert server.log().count("event=output_unlike_config model=pass_through") == 1


def test_response_parameters_reach_every_client(served: Served) -> None:
    server, http_url, grpc_url = served
    params = {"bool": True, "str": "Hello World!", "int": 1024, "neg": -3}
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert _grpc_params(client.infer("parameters", _p(params))) == params
        assert _grpc_params(client.infer("parameters", _p({}))) == {}
    result = httpclient.InferenceServerClient(http_url).infer("parameters", _p(params, httpclient))
    assert result.get_response()["parameters"] == params
    with Client(f"ipc://{server.runtime_dir}/zinfer.sock") as native:
        text = np.array([[json.dumps(params).encode()]], dtype=np.object_)
        assert native.infer("parameters", {"P": text}).parameters == params


@pytest.mark.parametrize(
    "params, text",
    [
        ([], "Expect None or <class 'dict'>, got <class 'list'>"),
        ({"1": "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"int": 2, "float": 0.5}, "values to have type bool/int/str, found type <class 'float'>"),
        ({"null": None}, "values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"list": ["v"]}, "values to have type bool/int/str, found type <class 'list'>"),
    ],
)
def test_bad_response_parameters_get_tritons_texts(served: Served, params: Any, text: str) -> None:
    _, _, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client, pytest.raises(InferenceServerException) as err:
        client.infer("parameters", _p(params))
    assert "[StatusCode.INVALID_ARGUMENT] " in str(err.value) and text in str(err.value)


def test_async_decoupled_batches_run_side_by_side(served: Served) -> None:
    """Four 1 s requests end together, not one after another (4 s)."""
    _, _, grpc_url = served
    done: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(lambda result, error: done.put((time.monotonic(), result, error)))
    try:
        start = time.monotonic()
        for _ in range(4):
            client.async_stream_infer("async_sleep", _x(1))
        ends = [done.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
        client.close()
    assert all(error is None and result.as_numpy("Y").tolist() == [[1]] for _, result, error in ends)
    assert max(t for t, _, _ in ends) - start < 2.5, [t - start for t, _, _ in ends]


def _at_once(grpc_url: str, model: str, values: list[int]) -> list[tuple[float, Any, Any]]:
    """``values`` sent to ``model`` at once, one request each; (seconds to its end, result, error) each."""
    done: queue.Queue[tuple[int, float, Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        start = time.monotonic()
        for i, value in enumerate(values):
            client.async_infer(
                model, _x(value), lambda result, error, i=i: done.put((i, time.monotonic(), result, error))
            )
        ends = sorted(done.get(timeout=30) for _ in values)
    return [(t - start, result, error) for _, t, result, error in ends]


def test_async_batches_that_return_their_responses_run_side_by_side(served: Served) -> None:
    """A model that is not decoupled: four 1 s requests end together (not in 4 s), each with its own
    answer."""
    ends = _at_once(served[2], "async_answers", [1, 2, 3, 4])
    assert [error for _, _, error in ends] == [None] * 4
    assert [result.as_numpy("Y").tolist() for _, result, _ in ends] == [[[10]], [[20]], [[30]], [[40]]]
    assert max(t for t, _, _ in ends) < 2.5, [t for t, _, _ in ends]


def test_an_async_batch_that_raises_fails_only_its_own_request(served: Served) -> None:
    ends = _at_once(served[2], "async_answers", [1, -1, 3, 4])
    assert [result.as_numpy("Y").tolist() for i, (_, result, _) in enumerate(ends) if i != 1] == [
        [[10]],
        [[30]],
        [[40]],
    ]
    error = ends[1][2]
    assert ends[1][1] is None and error is not None
    assert "Failed to process the request(s) for model 'async_answers'" in str(error), str(error)
    assert "ValueError: X cannot be negative" in str(error), str(error)
    assert max(t for t, _, _ in ends) < 2.5, [t for t, _, _ in ends]
    # the instance is free again: the next request is answered as before
    assert [r.as_numpy("Y").tolist() for _, r, _ in _at_once(served[2], "async_answers", [5])] == [[[50]]]


def test_error_codes_and_texts_as_triton_answers_them(served: Served) -> None:
    _, http_url, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        with pytest.raises(InferenceServerException) as err:
            client.infer("errors", _x(0))
        assert str(err.value) == "[StatusCode.UNKNOWN] unknown kind"
        with pytest.raises(InferenceServerException) as err:
            client.infer("errors", _x(1))
        assert err.value.status() == "StatusCode.INTERNAL"
        assert err.value.message().startswith("Failed to process the request(s) for model 'errors', message:")
        assert "NameError" in err.value.message()
        assert client.infer("errors", _x(2)).as_numpy("Y").tolist() == [[2]]
    with pytest.raises(InferenceServerException) as err:
        httpclient.InferenceServerClient(http_url).infer("errors", _x(1, httpclient))
    assert err.value.message().startswith("Failed to process the request(s) for model ")


def test_a_sent_response_stands_whatever_follows(served: Served) -> None:
    """A model that is not decoupled sends its response, then returns another (the sender is closed) or
    raises (a second send): the client gets the sent one, as from Triton."""
    _, _, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.infer("sent_stands", _x(0)).as_numpy("Y").tolist() == [[1]]
        assert client.infer("sent_stands", _x(1)).as_numpy("Y").tolist() == [[1]]


def test_the_models_own_is_ready_decides_its_readiness(served: Served) -> None:
    """Each readiness query is answered by a fresh is_ready() call, never an older answer (True only for
    True: False, an exception or another value is not ready); inference goes on either way."""
    _, http_url, grpc_url = served
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http = httpclient.InferenceServerClient(http_url)
    flag_file = REPOSITORY["served"] / "readiness" / "1" / "ready_flag"
    # no flag file yet: False, once the call made at load has answered
    wait_for(lambda: not http.is_model_ready("readiness"), 20, "the first is_ready() answer")
    for text, ready in (("true", True), ("false", False), ("raise", False), ("maybe", False), ("true", True)):
        flag_file.write_text(text)
        assert http.is_model_ready("readiness") is ready, text  # the very next query sees it
        assert grpc.is_model_ready("readiness") is ready, text
        assert grpc.infer("readiness", _x(1)).as_numpy("Y").tolist() == [[3]]
    grpc.close()


def test_model_code_sees_no_worker_flags_in_sys_argv(served: Served) -> None:
    """A model that runs unittest.main() (Triton's qa models do) finds only the program in sys.argv (11),
    not the worker's flags, which made unittest exit the worker."""
    _, _, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.infer("argv", _x(1)).as_numpy("Y").tolist() == [[11]]


def test_a_slow_is_ready_times_out_and_the_next_query_waits_for_it(served: Served) -> None:
    """Triton's bound: a query whose is_ready() call runs past 5 s is not ready; the call runs on, and a
    query meanwhile waits for that call's answer (True) rather than starting another."""
    _, http_url, grpc_url = served
    calls = REPOSITORY["served"] / "slow_ready" / "1" / "calls"
    wait_for(lambda: calls.exists() and "end" in calls.read_text(), 30, "the call made at load to end")
    http = httpclient.InferenceServerClient(http_url, network_timeout=30)
    with grpcclient.InferenceServerClient(grpc_url) as grpc:
        start = time.monotonic()
        assert http.is_model_ready("slow_ready") is False  # past the bound
        assert 4.5 < time.monotonic() - start < 6.4, time.monotonic() - start
        assert grpc.infer("slow_ready", _x(1)).as_numpy("Y").tolist() == [[4]]  # inference goes on
        assert grpc.is_model_ready("slow_ready") is True  # the running call's answer
        assert time.monotonic() - start < 10
    assert calls.read_text().split() == ["start", "end", "start", "end"]  # one call for both queries


def _stream(grpc_url: str, model: str, value: int, headers: dict[str, str] | None = None) -> list[Any]:
    """What a stream's callback got for one request (results and errors), until it went quiet."""
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(lambda result, error: got.put(result if error is None else error), headers=headers)
    try:
        client.async_stream_infer(model, _x(value))
        items = [got.get(timeout=30)]
        while True:
            try:
                items.append(got.get(timeout=1.0))
            except queue.Empty:
                return items
    finally:
        client.stop_stream()
        client.close()


def test_a_decoupled_model_that_returns_responses_gets_tritons_text(served: Served) -> None:
    _, _, grpc_url = served
    (error,) = _stream(grpc_url, "decoupled_errors", 0)
    assert isinstance(error, InferenceServerException)
    expected = "Python model 'decoupled_errors_0_0' is using the decoupled mode and the execute function "
    assert expected + "must return None." in error.message()


def test_triton_grpc_error_header_ends_the_stream_with_the_status(served: Served) -> None:
    _, _, grpc_url = served
    plain = _stream(grpc_url, "decoupled_errors", 1)
    assert plain[0].as_numpy("Y").tolist() == [[1]]
    assert isinstance(plain[1], InferenceServerException) and "second one fails" in plain[1].message()
    headed = _stream(grpc_url, "decoupled_errors", 1, {"triton_grpc_error": "true"})
    assert headed[0].as_numpy("Y").tolist() == [[1]]
    assert isinstance(headed[1], InferenceServerException)
    assert headed[1].status() == "StatusCode.INTERNAL" and "second one fails" in headed[1].message()


def test_response_iterator_cancel_reaches_the_called_model(served: Served) -> None:
    """The caller cancels once its sum reaches 5: the called model sees is_cancelled() and ends with a
    CANCELLED error (sum 5 and the cancelled flag: 51); without cancel() it would send 200 responses."""
    _, _, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.infer("canceller", _x(1)).as_numpy("Y").tolist() == [[51]]


def test_a_cancelled_stream_goes_on_as_its_model_sends_it(served: Served) -> None:
    """Triton leaves a cancelled decoupled request to its model: one that ignores the cancel sends all
    its ten responses, and the caller gets them and the model's own last one (sum 10, not cancelled:
    100), not a CANCELLED end made by the server."""
    _, _, grpc_url = served
    with grpcclient.InferenceServerClient(grpc_url) as client:
        assert client.infer("canceller", _x(2)).as_numpy("Y").tolist() == [[100]]


IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy())]) for r in requests]
"""


def _config(name: str, max_batch_size: int) -> str:
    return json.dumps({
        "name": name, "backend": "python", "max_batch_size": max_batch_size,
        "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": ["1"]}],
        "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    })  # fmt: skip


def test_load_with_a_config_or_files_on_both_doors(tmp_path: Path) -> None:
    """Triton's load overrides: a config in place of config.pbtxt, or files as the model's folder."""
    repo = tmp_path / "models"
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "config.pbtxt").write_text(f'name: "ident"\nbackend: "python"\n{IO}')
    (repo / "ident" / "1" / "model.py").write_text(IDENTITY)
    http_url, grpc_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--model-control-mode", "explicit", "--http", http_url, "--grpc", grpc_url)
    try:
        wait_http(http_url)
        grpc = wait_grpc(grpc_url)
        http = httpclient.InferenceServerClient(http_url)
        grpc.load_model("ident", config=_config("ident", 4))  # the repository's model.py, this config
        assert grpc.get_model_config("ident", as_json=True)["config"]["max_batch_size"] == 4
        assert grpc.infer("ident", _x(6)).as_numpy("Y").tolist() == [[6]]
        # a model that is not in the repository at all: its files and config in the request
        http.load_model("fresh", config=_config("fresh", 2), files={"file:1/model.py": IDENTITY.encode()})
        assert http.is_model_ready("fresh")
        assert http.infer("fresh", _x(7, httpclient)).as_numpy("Y").tolist() == [[7]]
        assert not (repo / "fresh").exists()  # the repository is left as it was
        with Client(f"ipc://{server.runtime_dir}/zinfer.sock") as native:
            native.load_model("ident", config=_config("ident", 3))
            assert native.model_config("ident")["max_batch_size"] == 3
        for bad, text in (
            ({"file:1/model.py": IDENTITY.encode()}, "needs the model's config too"),
            ({"file:../escape.py": b"x"}, "must be relative"),
        ):
            config = None if "config too" in text else _config("other", 2)
            with pytest.raises(InferenceServerException) as err:
                grpc.load_model("other", config=config, files=bad)
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and text in err.value.message()
        assert not grpc.is_model_ready("other")
        grpc.close()
    finally:
        stop_all([server])


SEQUENCE_ONNX_CONFIG = """
name: "seq_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


def _sequence_graph(path: Path) -> None:
    """OUTPUT = INPUT + 100 START + 1000 END + 10 READY + CORRID (as int32): every control input counts."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    shape: list[int | str] = ["N", 1]
    i32 = TensorProto.INT32

    def const(name: str, value: int) -> Any:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, i32, [], [value]))

    nodes = [
        const("c100", 100), const("c1000", 1000), const("c10", 10),
        helper.make_node("Mul", ["START", "c100"], ["s"]),
        helper.make_node("Mul", ["END", "c1000"], ["e"]),
        helper.make_node("Mul", ["READY", "c10"], ["r"]),
        helper.make_node("Cast", ["CORRID"], ["id"], to=i32),
        helper.make_node("Add", ["INPUT", "s"], ["a1"]),
        helper.make_node("Add", ["a1", "e"], ["a2"]),
        helper.make_node("Add", ["a2", "r"], ["a3"]),
        helper.make_node("Add", ["a3", "id"], ["OUTPUT"]),
    ]  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, i32, shape) for n in ("INPUT", "START", "END", "READY")]
    inputs.append(helper.make_tensor_value_info("CORRID", TensorProto.UINT64, shape))
    outputs = [helper.make_tensor_value_info("OUTPUT", i32, shape)]
    graph = helper.make_graph(nodes, "seq", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def test_an_onnx_model_with_sequence_control_inputs_is_fed_by_the_batcher(tmp_path: Path) -> None:
    """The graph takes START, END, READY and CORRID, which config.pbtxt lists only under sequence_batching:
    it loads, and each request's control values reach it."""
    pytest.importorskip("onnxruntime")
    repo = tmp_path / "models"
    _sequence_graph(repo / "seq_onnx" / "1" / "model.onnx")
    (repo / "seq_onnx" / "config.pbtxt").write_text(SEQUENCE_ONNX_CONFIG)
    server = start_server(repo)
    try:
        with Client(f"ipc://{server.runtime_dir}/zinfer.sock") as c:
            x = np.array([[5]], np.int32)
            first = c.infer("seq_onnx", {"INPUT": x}, sequence_id=7, sequence_start=True)
            middle = c.infer("seq_onnx", {"INPUT": x}, sequence_id=7)
            last = c.infer("seq_onnx", {"INPUT": x}, sequence_id=7, sequence_end=True)
        assert first.as_numpy("OUTPUT").tolist() == [[5 + 100 + 10 + 7]]
        assert middle.as_numpy("OUTPUT").tolist() == [[5 + 10 + 7]]
        assert last.as_numpy("OUTPUT").tolist() == [[5 + 1000 + 10 + 7]]
    finally:
        stop_all([server])
