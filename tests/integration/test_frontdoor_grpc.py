"""Triton's gRPC API on zinfer, called with the real tritonclient, unchanged: health, metadata, config,
statistics, model control, inference with FP32, INT8, BF16 and BYTES tensors, decoupled streams,
sequences, system shared memory and errors. One ``zinfer serve --grpc`` per gRPC server the door can run on
(grpcio; pygrpc-native when installed), every test on each."""

from __future__ import annotations

import asyncio
import importlib.util
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_grpc

pytestmark = pytest.mark.integration

MODELS = ("add", "double", "text_upper", "token_stream", "running_sum")


# every test on each gRPC server the door can run on: grpcio, and pygrpc-native where the frontdoor-native
# extra is installed (the test extra installs it)
SERVERS = ["grpcio", *(["native"] if importlib.util.find_spec("pygrpc_native") is not None else [])]


@pytest.fixture(scope="module", params=SERVERS)
def door(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[ServerProcess, str]]:
    repo = repository(tmp_path_factory.mktemp("fd"), MODELS)
    url = f"127.0.0.1:{free_port()}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ZINFER_GRPC_SERVER", request.param)
        server = start_server(repo, "--grpc", url, "--model-control-mode", "explicit", "--load-model", "*")
    try:
        wait_grpc(url).close()
        assert f"server={'pygrpc-native' if request.param == 'native' else 'grpcio'}" in server.log()
        yield server, url
    finally:
        stop_all([server])


@pytest.fixture
def client(door: tuple[ServerProcess, str]) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(door[1])
    yield c
    c.close()


def _input(name: str, data: np.ndarray[Any, Any], datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    return inp


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and not client.is_model_ready("nope")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "zinfer" and "system_shared_memory" in meta["extensions"]
    model = client.get_model_metadata("add", as_json=True)
    assert model["name"] == "add" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT_A", "FP32", ["-1", "1"]),
        ("INPUT_B", "FP32", ["-1", "1"]),
    ]


def test_config_is_tritons_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("add").config
    assert config.name == "add" and config.max_batch_size == 16
    assert [i.name for i in config.input] == ["INPUT_A", "INPUT_B"]
    assert config.input[0].data_type == grpcclient.model_config_pb2.TYPE_FP32
    assert list(config.input[0].dims) == [1]
    assert config.HasField("dynamic_batching")
    decoupled = client.get_model_config("token_stream").config
    assert decoupled.model_transaction_policy.decoupled


def test_infer_fp32_with_request_id(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(4, 1)
    result = client.infer("add", [_input("INPUT_A", a, "FP32"), _input("INPUT_B", a * 10, "FP32")],
                          request_id="req-7")  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("OUTPUT_SUM"), a * 11)
    assert result.get_response().id == "req-7"
    assert result.get_response().model_name == "add"


def test_infer_int8_bf16_and_bytes(client: grpcclient.InferenceServerClient) -> None:
    i8 = np.array([[-128, 0, 127]], dtype=np.int8)
    bf = np.array([[1.5, -2.25, 3.0]], dtype=ml_dtypes.bfloat16)
    result = client.infer("echo", [_input("I8", i8, "INT8"), _input("BF", bf, "BF16")])
    np.testing.assert_array_equal(result.as_numpy("I8_OUT"), i8)
    assert result.as_numpy("BF_OUT").tobytes() == bf.tobytes()
    text = np.array([[b"hello"], [b"front door"]], dtype=np.object_)
    upper = client.infer("text_upper", [_input("TEXT", text, "BYTES")]).as_numpy("UPPER")
    assert upper.reshape(-1).tolist() == [b"HELLO", b"FRONT DOOR"]


def test_requested_outputs_only(client: grpcclient.InferenceServerClient) -> None:
    text = np.array([[b"ab"]], dtype=np.object_)
    result = client.infer("text_upper", [_input("TEXT", text, "BYTES")],
                          outputs=[grpcclient.InferRequestedOutput("TOKENS")])  # fmt: skip
    assert result.as_numpy("UPPER") is None and result.as_numpy("TOKENS") is not None


def test_statistics_count_requests(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("double").model_stats[0].inference_count
    a = np.ones((2, 3), np.float32)
    client.infer("double", [_input("A", a, "FP32"), _input("B", a, "FP32")])
    stats = client.get_inference_statistics("double").model_stats
    assert stats[0].name == "double" and stats[0].inference_count == before + 2
    assert stats[0].inference_stats.success.count >= 1
    names = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"add", "double", "echo"} <= names


def test_repository_index_and_model_control(client: grpcclient.InferenceServerClient) -> None:
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index["double"] == "READY"
    client.unload_model("double")
    assert _wait(lambda: not client.is_model_ready("double"))
    client.load_model("double")
    assert client.is_model_ready("double")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("not_in_repo")
    assert err.value.status() == "StatusCode.NOT_FOUND"


def _wait(condition: Any, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _stream(client: grpcclient.InferenceServerClient) -> queue.Queue[Any]:
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error if error is not None else result))
    return results


def test_decoupled_stream(client: grpcclient.InferenceServerClient) -> None:
    results = _stream(client)
    try:
        text = np.array([b"one two three"], dtype=np.object_)
        client.async_stream_infer("token_stream", [_input("TEXT", text, "BYTES")], request_id="s1")
        tokens = [results.get(timeout=30).as_numpy("TOKEN").tolist() for _ in range(3)]
        assert tokens == [[b"one"], [b"two"], [b"three"]]
        # Triton's empty final response, only when asked for
        client.async_stream_infer("token_stream", [_input("TEXT", np.array([b"x"], dtype=np.object_),
                                  "BYTES")], enable_empty_final_response=True)  # fmt: skip
        first, last = results.get(timeout=30), results.get(timeout=30)
        assert first.as_numpy("TOKEN").tolist() == [b"x"]
        assert first.get_response().parameters["triton_final_response"].bool_param is False
        assert last.get_response().parameters["triton_final_response"].bool_param is True
        assert results.empty()
    finally:
        client.stop_stream()


@pytest.mark.parametrize("sequence_id", [41, 2**40 + 5])
def test_sequence_over_stream_and_unary(
    client: grpcclient.InferenceServerClient, sequence_id: int | str
) -> None:
    x = np.ones((1, 1), np.float32)
    results = _stream(client)
    try:
        for i, (start, end) in enumerate(((True, False), (False, False), (False, True))):
            inputs = [_input("X", x * (i + 1), "FP32")]
            client.async_stream_infer("running_sum", inputs, sequence_id=sequence_id,
                                      sequence_start=start, sequence_end=end)  # fmt: skip
        sums = [results.get(timeout=30).as_numpy("SUM").item() for _ in range(3)]
    finally:
        client.stop_stream()
    assert sums == [1.0, 3.0, 6.0]
    unary = [client.infer("running_sum", [_input("X", x * 5, "FP32")], sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end).as_numpy("SUM").item()
             for start, end in ((True, False), (False, True))]  # fmt: skip
    assert unary == [5.0, 10.0]


def test_a_string_sequence_id_to_a_numeric_corrid_model_is_invalid_argument(
    client: grpcclient.InferenceServerClient,
) -> None:
    """running_sum keys its sums on a TYPE_UINT64 CORRID: a string id is refused, not turned into 0."""
    x = _input("X", np.ones((1, 1), np.float32), "FP32")
    with pytest.raises(InferenceServerException) as err:
        client.infer("running_sum", [x], sequence_id="seq-string-id", sequence_start=True)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "CORRID control 'CORRID' to be TYPE_STRING" in str(err.value.message())


def test_system_shared_memory_round_trip(client: grpcclient.InferenceServerClient) -> None:
    key = f"/fdtest_{uuid.uuid4().hex[:12]}"
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    nbytes = a.nbytes
    handle = shm.create_shared_memory_region("fd_in", key, 3 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [a, a * 2])
        client.register_system_shared_memory("fd_in", key, 3 * nbytes)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]["fd_in"]
        assert status["key"] == key and int(status["byte_size"]) == 3 * nbytes
        inputs = [grpcclient.InferInput("A", [2, 4], "FP32"), grpcclient.InferInput("B", [2, 4], "FP32")]
        inputs[0].set_shared_memory("fd_in", nbytes)
        inputs[1].set_shared_memory("fd_in", nbytes, offset=nbytes)
        out = grpcclient.InferRequestedOutput("SUM")
        out.set_shared_memory("fd_in", nbytes, offset=2 * nbytes)
        result = client.infer("double", inputs, outputs=[out])
        assert result.get_output("SUM").parameters["shared_memory_byte_size"].int64_param == nbytes
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=2 * nbytes)
        np.testing.assert_array_equal(got, a * 3)
        with pytest.raises(InferenceServerException) as err:  # a range past the region's end
            inputs[0].set_shared_memory("fd_in", nbytes, offset=3 * nbytes)
            client.infer("double", inputs)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
    with pytest.raises(InferenceServerException) as err:
        client.get_system_shared_memory_status("fd_in")
    assert "Unable to find system shared memory region: 'fd_in'" in err.value.message()


def test_shared_memory_keys_that_are_not_the_callers_are_refused(
    client: grpcclient.InferenceServerClient,
) -> None:
    for key in ("/../etc/passwd", "/zinfer-anything", "/no_such_segment_fd", "/dev/shm/x"):
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("bad", key, 8)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT", key
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_errors_have_tritons_codes_and_texts(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 1), np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", [_input("INPUT_A", a, "FP32")])
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert err.value.message() == "Request for unknown model: 'nope' is not found"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("add", "7")
    assert err.value.message() == "Request for unknown model: 'add' version 7 is not found"
    with pytest.raises(InferenceServerException) as err:  # a wrong input name
        client.infer("add", [_input("WRONG", a, "FP32"), _input("INPUT_B", a, "FP32")])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as err:  # classification of a string output
        client.infer("text_upper", [_input("TEXT", np.array([[b"a"]], dtype=np.object_), "BYTES")],
                     outputs=[grpcclient.InferRequestedOutput("UPPER", class_count=2)])  # fmt: skip
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.value.message() == "class result not available for output due to unsupported type 'BYTES'"
    text = np.array([b"a b"], dtype=np.object_)
    with pytest.raises(InferenceServerException) as err:  # a decoupled model answers streams only
        client.infer("token_stream", [_input("TEXT", text, "BYTES")])
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    assert err.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    with pytest.raises(InferenceServerException) as err:  # as Triton without GPUs (test_cuda_shm_api.py)
        client.register_cuda_shared_memory("c", b"\0" * 64, 0, 8)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()  # none of it hurt the front door


def test_byte_count_mismatch_is_refused(door: tuple[ServerProcess, str]) -> None:
    """A raw request whose bytes disagree with its shape (tritonclient cannot send one)."""
    with grpc.insecure_channel(door[1]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add")
        for name in ("INPUT_A", "INPUT_B"):
            request.inputs.add(name=name, datatype="FP32", shape=[1, 1])
        request.raw_input_contents.extend([b"\0" * 4, b"\0" * 3])
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input byte size mismatch for input 'INPUT_B' for model 'add'. Expected 4, got 3" in str(
            err.value.details()
        )
        request.ClearField("raw_input_contents")
        request.inputs[0].contents.fp32_contents.extend([1.5])
        request.inputs[1].contents.fp32_contents.extend([2.0])
        response = stub.ModelInfer(request, timeout=30)
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [3.5]


def test_aio_client(door: tuple[ServerProcess, str]) -> None:
    async def run() -> list[float]:
        client = grpcaio.InferenceServerClient(door[1])
        try:
            assert await client.is_server_ready()
            calls = []
            for i in range(16):
                a = np.full((1, 1), i, np.float32)
                inputs = [
                    grpcaio.InferInput("INPUT_A", [1, 1], "FP32"),
                    grpcaio.InferInput("INPUT_B", [1, 1], "FP32"),
                ]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(a)
                calls.append(client.infer("add", inputs))
            results = await asyncio.wait_for(asyncio.gather(*calls), 60)
            return [r.as_numpy("OUTPUT_SUM").item() for r in results]
        finally:
            await client.close()

    assert asyncio.run(run()) == [2.0 * i for i in range(16)]
