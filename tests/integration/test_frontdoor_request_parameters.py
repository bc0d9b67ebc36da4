"""A request's own parameters reach the model through both front doors, as in Triton (a python model reads
them with ``request.parameters()``); the ones the door consumes (priority, timeout, sequence fields,
``binary_data_output``, Triton's stream flags) do not. Unary gRPC, the gRPC stream and HTTP."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import free_port, wait_grpc, wait_http

pytestmark = pytest.mark.integration

MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            seen = json.dumps(json.loads(request.parameters()), sort_keys=True).encode()
            tensor = pb_utils.Tensor("SEEN", np.array([seen], dtype=np.object_))
            out.append(pb_utils.InferenceResponse([tensor]))
        return out
"""

CONFIG = """
name: "param_echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, str]]:
    repo = tmp_path_factory.mktemp("fdp") / "models"
    (repo / "param_echo" / "1").mkdir(parents=True)
    (repo / "param_echo" / "1" / "model.py").write_text(MODEL)
    (repo / "param_echo" / "config.pbtxt").write_text(CONFIG)
    grpc_url, http_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--grpc", grpc_url, "--http", http_url)
    try:
        wait_grpc(grpc_url).close()
        wait_http(http_url)
        yield server, grpc_url, http_url
    finally:
        stop_all([server])


def _x(module: Any) -> Any:
    inp = module.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    return inp


def _seen(result: Any) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(result.as_numpy("SEEN")[0])
    return value


OWN = {"tag": "blue", "count": 3, "flag": True, "ratio": 0.5}


def test_grpc_unary_passes_the_request_parameters(door: tuple[ServerProcess, str, str]) -> None:
    with grpcclient.InferenceServerClient(door[1]) as client:
        result = client.infer("param_echo", [_x(grpcclient)], parameters=OWN, timeout=10**7)
    assert _seen(result) == OWN


def test_grpc_stream_passes_the_request_parameters(door: tuple[ServerProcess, str, str]) -> None:
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(door[1]) as client:
        client.start_stream(
            callback=lambda result, error: results.put(error if error is not None else result)
        )
        try:
            client.async_stream_infer("param_echo", [_x(grpcclient)], parameters=OWN,
                                      enable_empty_final_response=True)  # fmt: skip
            first = results.get(timeout=30)
        finally:
            client.stop_stream()
    assert _seen(first) == OWN


def test_http_passes_the_request_parameters(door: tuple[ServerProcess, str, str]) -> None:
    client = httpclient.InferenceServerClient(door[2])
    try:
        result = client.infer("param_echo", [_x(httpclient)], parameters=OWN, timeout=10**7)
    finally:
        client.close()
    assert _seen(result) == OWN


def test_a_bytes_parameter_is_refused_over_grpc(door: tuple[ServerProcess, str, str]) -> None:
    """InferParameter's bytes_param has no place in a request's parameters: a clear error, no crash."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    if "bytes_param" not in service_pb2.InferParameter.DESCRIPTOR.fields_by_name:
        pytest.skip("this tritonclient's InferParameter has no bytes_param")
    with grpc.insecure_channel(door[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="param_echo")
        request.inputs.add(name="X", datatype="FP32", shape=[1])
        request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
        request.parameters["blob"].bytes_param = b"\x00\x01"
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "blob" in str(err.value.details())
