"""ONNX models served through ONNX Runtime by a real ``zinfer serve``: auto-completed config, dynamic
batching (the model gets the whole batch), results bit-exact against NumPy, TYPE_STRING tensors, a model
folder holding nothing but ``1/model.onnx``, and a clear load error."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.conftest import TRITON_TIMING, ServerProcess, start_server, wait_for  # noqa: E402
from tests.onnx_models import WEIGHTS, add_matmul, string_identity  # noqa: E402
from zinfer.client.client import Client  # noqa: E402
from zinfer.client.errors import InvalidArgument  # noqa: E402

pytestmark = pytest.mark.integration

CLIENTS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    # no input, output or max_batch_size: all three come from the graph (max_batch_size 4, Triton's default)
    add_matmul(repo / "addmm" / "1" / "model.onnx")
    (repo / "addmm" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\n'
        "dynamic_batching { max_queue_delay_microseconds: 20000000 }\n"
        "instance_group [ { kind: KIND_CPU } ]\n" + TRITON_TIMING
    )
    add_matmul(repo / "wrong" / "1" / "model.onnx")
    (repo / "wrong" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 2\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] },\n'
        '        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { kind: KIND_CPU } ]\n"
    )
    # TYPE_STRING in and out, config completed from the graph
    string_identity(repo / "strings" / "1" / "model.onnx")
    (repo / "strings" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    # no config.pbtxt at all: the newest version's model.onnx makes it an ONNX model, as in Triton
    add_matmul(repo / "bare" / "1" / "model.onnx")
    s = start_server(repo)
    yield s
    s.stop()


def _inputs(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    a = rng.integers(-50, 50, size=(rows, 4)).astype(np.float32)  # integers: A @ W exact in any order
    b = rng.standard_normal((rows, 4)).astype(np.float32)
    return {"A": a, "B": b}


def test_config_is_auto_completed_from_the_graph(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        config = c.model_config("addmm")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], list(t["dims"])) for t in config["input"]] == [
        ("A", "TYPE_FP32", [4]),
        ("B", "TYPE_FP32", [4]),
    ]
    assert [(t["name"], list(t["dims"])) for t in config["output"]] == [("SUM", [4]), ("PROJ", [3])]


def test_concurrent_requests_run_as_one_batch_bit_exact(server: ServerProcess) -> None:
    rng = np.random.default_rng(16)
    sent = [_inputs(rng, 1) for _ in range(CLIENTS)]
    got: dict[int, dict[str, np.ndarray]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(CLIENTS)

    def one(i: int) -> None:
        try:
            with Client(server.url, timeout=30) as c:
                barrier.wait(10)
                result = c.infer("addmm", sent[i])
                got[i] = {"SUM": result.as_numpy("SUM"), "PROJ": result.as_numpy("PROJ")}
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not errors, errors
    assert sorted(got) == list(range(CLIENTS))
    for i, inputs in enumerate(sent):
        expected_sum = inputs["A"] + inputs["B"]
        expected_proj = inputs["A"] @ WEIGHTS
        assert got[i]["SUM"].dtype == np.float32 and got[i]["SUM"].shape == (1, 4)
        assert got[i]["SUM"].tobytes() == expected_sum.tobytes()
        assert got[i]["PROJ"].tobytes() == expected_proj.tobytes()
    with Client(server.url, timeout=30) as c:
        stats = c.statistics("addmm")["model_stats"][0]
    # the preferred size (the completed max_batch_size) was reached: the four went to the model at once
    assert {"batch_size": CLIENTS, "count": 1} in stats["batch_stats"]


def test_a_request_carrying_its_own_batch(server: ServerProcess) -> None:
    inputs = _inputs(np.random.default_rng(7), 4)
    with Client(server.url, timeout=30) as c:
        result = c.infer("addmm", inputs, outputs=["PROJ"])
    assert result.as_numpy("PROJ").tobytes() == (inputs["A"] @ WEIGHTS).tobytes()


def test_a_config_that_does_not_match_the_graph_fails_its_load_clearly(server: ServerProcess) -> None:
    text = "input 'A' is TYPE_INT32 in config.pbtxt but TYPE_FP32 in the graph"
    with Client(server.url, timeout=30) as c:

        def reason() -> str:
            return str(next(m for m in c.repository_index() if m["name"] == "wrong"))

        wait_for(lambda: text in reason(), 30, "the load error of 'wrong' in the repository index")
        assert not c.is_model_ready("wrong")
        assert c.is_model_ready("addmm")


def test_string_tensors_in_and_out(server: ServerProcess) -> None:
    rows = [[b"caf\xc3\xa9", b"", b"a\x00b"], [b"x" * 5000, b"1", "\u00e9t\u00e9 \u2603".encode()]]
    text = np.array(rows, dtype=object)
    with Client(server.url, timeout=30) as c:
        config = c.model_config("strings")
        assert [(t["name"], t["data_type"]) for t in config["input"]] == [("TEXT", "TYPE_STRING")]
        out = c.infer("strings", {"TEXT": text}).as_numpy("OUT")
        assert out.shape == (2, 3)
        assert list(out.reshape(-1)) == list(text.reshape(-1))
        # not UTF-8: ONNX Runtime cannot take it; a clear InvalidArgument, and the model keeps serving
        with pytest.raises(InvalidArgument, match="input 'TEXT': element 1 of the batch is not UTF-8"):
            c.infer("strings", {"TEXT": np.array([[b"ok", b"\xff"]], dtype=object)})
        again = c.infer("strings", {"TEXT": np.array([[b"still here"]], dtype=object)}).as_numpy("OUT")
        assert list(again.reshape(-1)) == [b"still here"]


def test_a_folder_with_only_a_model_onnx_is_an_onnx_model(server: ServerProcess) -> None:
    inputs = _inputs(np.random.default_rng(3), 2)
    with Client(server.url, timeout=30) as c:
        config = c.model_config("bare")
        assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
        assert [t["name"] for t in config["input"]] == ["A", "B"]
        result = c.infer("bare", inputs)
    assert result.as_numpy("SUM").tobytes() == (inputs["A"] + inputs["B"]).tobytes()
    assert result.as_numpy("PROJ").tobytes() == (inputs["A"] @ WEIGHTS).tobytes()
