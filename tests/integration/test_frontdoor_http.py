"""Triton's HTTP/REST API on zinfer, called with the real tritonclient (``tritonclient.http`` and
``tritonclient.http.aio``), unchanged: health, metadata, config, statistics, model control, inference with
FP32, INT8, BF16 and BYTES tensors as binary data and as JSON, system shared memory and errors; plus plain
HTTP (urllib) for status codes and bodies no client library shows. One ``zinfer serve --http`` per module."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_http
from zinfer.client import Client

pytestmark = pytest.mark.integration

MODELS = ("add", "double", "text_upper", "identity", "token_stream")


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    repo = repository(tmp_path_factory.mktemp("fdh"), MODELS)
    url = f"127.0.0.1:{free_port()}"
    server = start_server(
        repo, "--http", url, "--model-control-mode", "explicit", "--load-model", "*",
        "--max-tensor-bytes", str(1 << 20),
    )  # fmt: skip
    try:
        wait_http(url)
        yield server, url
    finally:
        stop_all([server])


@pytest.fixture
def client(door: tuple[ServerProcess, str]) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(door[1], network_timeout=30.0)
    yield c
    c.close()


def _input(
    name: str, data: np.ndarray[Any, Any], datatype: str, binary: bool = True
) -> httpclient.InferInput:
    inp = httpclient.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    return inp


def _raw(
    url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """A plain HTTP request: (status, parsed JSON body or the raw bytes or None)."""
    req = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    if not data:
        return status, None
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and not client.is_model_ready("nope")
    assert client.is_model_ready("add", "1") and not client.is_model_ready("add", "7")
    meta = client.get_server_metadata()
    assert meta["name"] == "zinfer" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("add")
    assert model["name"] == "add" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT_A", "FP32", [-1, 1]),
        ("INPUT_B", "FP32", [-1, 1]),
    ]
    config = client.get_model_config("add")
    assert config["name"] == "add" and config["max_batch_size"] == 16
    assert [i["name"] for i in config["input"]] == ["INPUT_A", "INPUT_B"]


def test_infer_fp32_binary_and_json(client: httpclient.InferenceServerClient) -> None:
    a = np.array([[1.5], [2.0], [-3.0]], dtype=np.float32)
    b = np.array([[0.5], [1.0], [3.0]], dtype=np.float32)
    for binary in (True, False):
        inputs = [_input("INPUT_A", a, "FP32", binary), _input("INPUT_B", b, "FP32", binary)]
        out = httpclient.InferRequestedOutput("OUTPUT_SUM", binary_data=binary)
        result = client.infer("add", inputs, outputs=[out], request_id=f"r-{binary}")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT_SUM"), a + b)
        response = result.get_response()
        assert response["id"] == f"r-{binary}" and response["model_version"] == "1"
        assert ("data" in response["outputs"][0]) is not binary


def test_infer_int8_bf16_and_bytes(client: httpclient.InferenceServerClient) -> None:
    i8 = np.array([[-128, 0, 5, 127]], dtype=np.int8)
    bf = np.array([[1.5, -2.25, 0.0, 3.0e8]], dtype=ml_dtypes.bfloat16)
    result = client.infer("echo", [_input("I8", i8, "INT8"), _input("BF", bf, "BF16")])
    np.testing.assert_array_equal(result.as_numpy("I8_OUT"), i8)
    got = result.as_numpy("BF_OUT")
    assert got.dtype == ml_dtypes.bfloat16 and got.tobytes() == bf.tobytes()
    json_i8 = client.infer(
        "echo", [_input("I8", i8, "INT8", binary=False), _input("BF", bf, "BF16")],
        outputs=[httpclient.InferRequestedOutput("I8_OUT", binary_data=False)],
    )  # fmt: skip
    np.testing.assert_array_equal(json_i8.as_numpy("I8_OUT"), i8)
    text = np.array([["hello world"], ["zïnfer"]], dtype=object)
    for binary in (True, False):
        result = client.infer(
            "text_upper", [_input("TEXT", text, "BYTES", binary)],
            outputs=[httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("UPPER", "TOKENS")],
        )  # fmt: skip
        assert [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("UPPER").reshape(-1)] == [
            "HELLO WORLD",
            "ZÏNFER",
        ]
        assert result.as_numpy("TOKENS").reshape(-1).tolist() == [2, 1]


def test_statistics_count_requests(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("double")["model_stats"][0]
    a = np.ones((1, 3), dtype=np.float32)
    for _ in range(3):
        client.infer("double", [_input("A", a, "FP32"), _input("B", a, "FP32")])
    after = client.get_inference_statistics("double")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 3
    every = client.get_inference_statistics()["model_stats"]
    assert {"add", "double", "text_upper"} <= {s["name"] for s in every}


def test_repository_index_and_model_control(client: httpclient.InferenceServerClient) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["identity"]["state"] == "READY"
    client.unload_model("identity")
    deadline = time.monotonic() + 30
    while client.is_model_ready("identity") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready("identity")
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [_input("INPUT0", np.ones((1, 2), np.float32), "FP32")])
    assert err.value.status() in ("400", "404", "503")
    client.load_model("identity")
    assert client.is_model_ready("identity")
    # a config override (Triton's load_model(name, config=...)) that does not make a model: refused, and
    # the model keeps serving as it was
    with pytest.raises(InferenceServerException, match="'identity' failed to load"):
        client.load_model("identity", config='{"max_batch_size": 2}')
    assert client.is_model_ready("identity")


def test_system_shared_memory_round_trip(client: httpclient.InferenceServerClient) -> None:
    key = f"/fdhttp_{uuid.uuid4().hex[:12]}"
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    nbytes = a.nbytes
    handle = shm.create_shared_memory_region("fdh_in", key, 3 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [a, a * 2])
        client.register_system_shared_memory("fdh_in", key, 3 * nbytes)
        (status,) = client.get_system_shared_memory_status()
        assert status["name"] == "fdh_in" and status["key"] == key and int(status["byte_size"]) == 3 * nbytes
        inputs = [httpclient.InferInput("A", [2, 4], "FP32"), httpclient.InferInput("B", [2, 4], "FP32")]
        inputs[0].set_shared_memory("fdh_in", nbytes)
        inputs[1].set_shared_memory("fdh_in", nbytes, offset=nbytes)
        out = httpclient.InferRequestedOutput("SUM")
        out.set_shared_memory("fdh_in", nbytes, offset=2 * nbytes)
        result = client.infer("double", inputs, outputs=[out])
        sent = result.get_output("SUM")  # the bytes are in the region, not the response
        assert sent["shape"] == [2, 4] and "data" not in sent and "parameters" not in sent
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=2 * nbytes)
        np.testing.assert_array_equal(got, a * 3)
        small = httpclient.InferRequestedOutput("SUM")
        small.set_shared_memory("fdh_in", nbytes // 2, offset=2 * nbytes)
        with pytest.raises(InferenceServerException, match="should be at least 32 bytes"):
            client.infer("double", inputs, outputs=[small])
        with pytest.raises(InferenceServerException) as err:  # a range past the region's end
            inputs[0].set_shared_memory("fdh_in", nbytes, offset=3 * nbytes)
            client.infer("double", inputs)
        assert err.value.status() == "400"
        inputs[0] = httpclient.InferInput("A", [2, 4], "FP32")
        with pytest.raises(InferenceServerException) as err:  # fewer bytes than the shape holds
            inputs[0].set_shared_memory("fdh_in", nbytes - 4)
            client.infer("double", inputs)
        assert err.value.status() == "400" and "unexpected total byte size 28 for input 'A'" in str(err.value)
        inputs[0] = httpclient.InferInput("A", [2, 4], "FP32")
        inputs[0].set_shared_memory("fdh_in", nbytes)
        client.infer("double", inputs, outputs=[out])  # and the region still serves
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 4], offset=2 * nbytes)
        np.testing.assert_array_equal(got, a * 3)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)
    with pytest.raises(InferenceServerException) as err:
        client.get_system_shared_memory_status("fdh_in")
    assert err.value.status() == "404" and "Unable to find system shared memory region: 'fdh_in'" in str(
        err.value
    )


def test_errors_have_tritons_statuses_and_texts(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 1), dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", [_input("INPUT_A", a, "FP32")])
    assert err.value.status() == "404" and "Request for unknown model: 'nope' is not found" in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "404"
    bad = np.ones((1, 3), dtype=np.float32)  # add takes [-1, 1]
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [_input("INPUT_A", bad, "FP32"), _input("INPUT_B", bad, "FP32")])
    assert err.value.status() == "400" and "INPUT_A" in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("c", "AAAA", 0, 8)
    assert err.value.status() == "400" and "GPUs not supported" in str(err.value)  # as Triton without GPUs
    with pytest.raises(InferenceServerException) as err:  # as Triton: a decoupled model needs gRPC streaming
        client.infer("token_stream", [_input("TEXT", np.array([b"a b"], dtype=object), "BYTES")])
    assert err.value.status() == "501" and "decoupled transaction policy" in str(err.value)


def test_plain_http_status_codes_and_bodies(door: tuple[ServerProcess, str]) -> None:
    url = door[1]
    assert _raw(url, "/v2/health/live") == (200, None)
    assert _raw(url, "/v2/models/add/ready") == (200, None)
    assert _raw(url, "/v2/models/nope/ready") == (400, {"error": "Model version not ready"})
    assert _raw(url, "/v2/no/such/route") == (400, {"error": "Not Found"})
    assert _raw(url, "/v2/health/live", b"{}") == (405, {"error": "Method Not Allowed"})
    status, body = _raw(url, "/v2/models/nope/config")
    assert (status, body) == (404, {"error": "Request for unknown model: 'nope' is not found"})
    infer = "/v2/models/add/infer"
    assert _raw(url, infer, b"{not json")[0] == 400
    assert "failed to parse the request JSON buffer" in _raw(url, infer, b"{not json")[1]["error"]
    head = json.dumps({"inputs": [
        {"name": "INPUT_A", "datatype": "FP32", "shape": [1, 1], "parameters": {"binary_data_size": 4}},
        {"name": "INPUT_B", "datatype": "FP32", "shape": [1, 1], "parameters": {"binary_data_size": 4}},
    ], "outputs": [{"name": "OUTPUT_SUM", "parameters": {"binary_data": True}}]}).encode()  # fmt: skip
    tensors = np.float32(2.5).tobytes() + np.float32(4.0).tobytes()
    hdr = {"Inference-Header-Content-Length": str(len(head))}
    status, body = _raw(url, infer, head + tensors, hdr)
    assert status == 200 and isinstance(body, bytes)
    # the reply: JSON of the length the response header names, then the output's 4 bytes
    req = urllib.request.Request(f"http://{url}{infer}", data=head + tensors, headers=hdr)
    with urllib.request.urlopen(req, timeout=30) as r:
        n = int(r.headers["Inference-Header-Content-Length"])
        assert r.headers["Content-Type"] == "application/octet-stream"
        data = r.read()
    assert json.loads(data[:n])["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert np.frombuffer(data[n:], np.float32).tolist() == [6.5]
    status, body = _raw(url, infer, head + tensors[:6], hdr)
    assert status == 400 and "expecting 2 additional bytes for model 'add'" in body["error"]
    status, body = _raw(url, infer, head + tensors, {"Inference-Header-Content-Length": "zz"})
    assert status == 400 and "Unable to parse Inference-Header-Content-Length" in body["error"]
    big = json.dumps({"inputs": [{"name": "INPUT_A", "datatype": "FP32", "shape": [1 << 40, 1],
                                  "parameters": {"binary_data_size": 4}}]}).encode()  # fmt: skip
    status, body = _raw(url, infer, big + b"1234", {"Inference-Header-Content-Length": str(len(big))})
    assert status == 400 and "--max-tensor-bytes" in body["error"]
    assert _raw(url, "/v2/health/ready") == (200, None)  # the front door still serves


def test_huge_declared_body_is_refused_before_it_is_read(door: tuple[ServerProcess, str]) -> None:
    """A Content-Length far over the limit is answered at once (400) and the connection closed; the
    server does not wait for bytes that will never come."""
    host, port = door[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{")
        s.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 400"), data[:100]
    assert _raw(door[1], "/v2/health/ready") == (200, None)


def test_aio_client(door: tuple[ServerProcess, str]) -> None:
    async def run() -> None:
        client = httpaio.InferenceServerClient(door[1])
        try:
            assert await client.is_server_ready()
            assert (await client.get_model_metadata("add"))["name"] == "add"
            a = np.array([[1.0], [2.0]], dtype=np.float32)
            inputs = [
                httpaio.InferInput("INPUT_A", [2, 1], "FP32"),
                httpaio.InferInput("INPUT_B", [2, 1], "FP32"),
            ]
            for inp in inputs:
                inp.set_data_from_numpy(a)
            results = await asyncio.gather(*(client.infer("add", inputs) for _ in range(8)))
            for r in results:
                np.testing.assert_array_equal(r.as_numpy("OUTPUT_SUM"), a * 2)
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def _exchange(url: str, raw: bytes) -> bytes:
    """Send raw bytes on a fresh connection; what comes back until the server answers or closes (10 s)."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)  # the server sees the end of what we send: nothing may wait on more
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk


def test_hostile_http_never_hurts_the_front_door(door: tuple[ServerProcess, str]) -> None:
    """Malformed request lines, headers, chunked bodies, binary sections and JSON, 300 of them with a fixed
    seed: each is answered 4xx or the connection closed, the front-door process is the same one after, and
    it still serves."""
    server, url = door
    with Client(server.url, timeout=10) as c:
        before = [d["pid"] for d in c.server_status()["frontdoors"]]
    rng = np.random.default_rng(17)
    head = (
        b'{"inputs":[{"name":"INPUT_A","datatype":"FP32","shape":[1,1],"parameters":{"binary_data_size":4}}]}'
    )
    cases = [
        b"GARBAGE\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n",
        b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{",  # short, then EOF
        b"POST /v2/models/%ff%00/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    ]
    for _ in range(293):
        body = head + rng.bytes(int(rng.integers(0, 16)))
        hlen = str(int(rng.integers(-3, len(body) + 3)))
        if rng.random() < 0.3:
            body = bytearray(body)
            for i in rng.integers(0, len(body), size=3):
                body[i] = int(rng.integers(0, 256))
            body = bytes(body)
        cases.append(
            b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Inference-Header-Content-Length: {hlen}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    for raw in cases:
        answer = _exchange(url, raw)
        if answer:
            status = int(answer.split(b" ", 2)[1])
            assert status < 500 or status in (503,), answer[:300]
    with Client(server.url, timeout=10) as c:
        assert [d["pid"] for d in c.server_status()["frontdoors"]] == before
    assert _raw(url, "/v2/health/ready") == (200, None)
