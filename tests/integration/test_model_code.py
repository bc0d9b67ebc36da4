"""Model code on a real server: native and Triton-style model.py, errors per request and per batch,
strings, and models that fail to load while the others keep serving."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, start_server, wait_for
from zinfer.client import Client
from zinfer.client.errors import InternalError, InvalidArgument, Unavailable

pytestmark = pytest.mark.integration

PAIR = (
    "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 300000 }\n" + TRITON_TIMING
)
TENSORS = (
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },\n'
    '        { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] },\n'
    '         { name: "DIFF" data_type: TYPE_FP32 dims: [ 2 ] } ]'
)

NATIVE = """
    import numpy as np

    class Model:
        def initialize(self, config):
            self.offset = float(config["parameters"]["offset"]["string_value"])

        def execute(self, inputs):
            a, b = inputs["A"], inputs["B"]
            if (a == 9).any():
                raise ValueError("nine is not a number I like")
            return {"SUM": a + b + self.offset, "DIFF": a - b}
"""

TRITON = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            sum_config = pb_utils.get_output_config_by_name(config, "SUM")
            self.dtype = pb_utils.triton_string_to_numpy(sum_config["data_type"])
            print("triton model ready on", args["model_instance_kind"])

        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
                print("triton model: request with", a.shape[0], "rows")
                if (a == 7).any():
                    error = pb_utils.TritonError("seven is not allowed")
                    responses.append(pb_utils.InferenceResponse(error=error))
                elif (a == 8).any():
                    err = pb_utils.TritonError("eight is invalid", pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(error=err))
                elif (a == 9).any():
                    raise pb_utils.TritonModelException("nine breaks the batch")
                else:
                    total = pb_utils.Tensor("SUM", (a + b).astype(self.dtype))
                    out = [total, pb_utils.Tensor("DIFF", (a - b).astype(self.dtype))]
                    responses.append(pb_utils.InferenceResponse(output_tensors=out))
            return responses
"""

TRITON_ID = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                rows = pb_utils.get_input_tensor_by_name(request, "A").as_numpy().shape[0]
                ids = np.array([[request.request_id().encode()]] * rows, dtype=object)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ID", ids)]))
            return responses
"""


def _model(repo: Path, name: str, config: str, code: str | None = None) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}\n')
    if code is not None:
        (version / "model.py").write_text(textwrap.dedent(code))
    return version


def _python(body: str) -> str:
    return f'backend: "python"\nmax_batch_size: 8\n{TENSORS}\n{body}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODELS / "add", repo / "add")
    shutil.copytree(MODELS / "text_upper", repo / "text_upper")
    _model(
        repo,
        "native",
        _python(f'{PAIR}\nparameters {{ key: "offset" value: {{ string_value: "0.5" }} }}'),
        NATIVE,
    )
    _model(repo, "triton", _python(PAIR), TRITON)
    _model(
        repo,
        "triton_id",
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        f'output [ {{ name: "ID" data_type: TYPE_STRING dims: [ 1 ] }} ]\n{PAIR}',
        TRITON_ID,
    )
    _model(repo, "bad_import", _python(""), "import numpy\nraise RuntimeError('no licence file')\n")
    _model(
        repo,
        "bad_init",
        _python(""),
        "class Model:\n    def initialize(self, config):\n        open('/nonexistent/tokenizer.json')\n"
        "    def execute(self, inputs):\n        return {}\n",
    )
    _model(
        repo,
        "no_weights",
        'backend: "zinfer"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'parameters { key: "kernel" value: { string_value: "mlp" } }',
    )
    _model(repo, "bad_config", _python("max_batch_size: -3"), NATIVE)
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, timeout=30) as c:
        yield c


def _ab(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"A": np.full((rows, 2), value, np.float32), "B": np.ones((rows, 2), np.float32)}


def _together(client: Client, model: str, values: list[float]) -> list[Any]:
    """Send requests at once (they form one batch of the preferred size); results or exceptions."""

    def one(value: float) -> Any:
        try:
            return client.infer(model, _ab(value)).as_numpy("SUM")
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(one, values))


def _batch_sizes(client: Client, model: str) -> dict[int, int]:
    stats = client.statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["count"]) for b in stats["batch_stats"]}


def test_native_model_serves_batches(client: Client) -> None:
    good, other = _together(client, "native", [1.0, 2.0])
    np.testing.assert_array_equal(good, np.full((1, 2), 2.5))
    np.testing.assert_array_equal(other, np.full((1, 2), 3.5))
    assert _batch_sizes(client, "native").get(2, 0) >= 1
    result = client.infer("native", _ab(3.0, rows=3))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), np.full((3, 2), 2.0))


def test_native_exception_fails_only_its_batch(client: Client) -> None:
    first, second = _together(client, "native", [9.0, 1.0])
    for failed in (first, second):
        assert isinstance(failed, InternalError) and "model raised ValueError: nine" in str(failed)
    np.testing.assert_array_equal(client.infer("native", _ab(1.0)).as_numpy("SUM"), np.full((1, 2), 2.5))


def test_triton_model_loops_over_requests_and_prints(client: Client, server: ServerProcess) -> None:
    assert "triton model ready on CPU" in server.log()
    a, b = _together(client, "triton", [1.0, 4.0])
    np.testing.assert_array_equal(a, np.full((1, 2), 2.0))
    np.testing.assert_array_equal(b, np.full((1, 2), 5.0))
    wait_for(lambda: "triton model: request with 1 rows" in server.log(), 10, "the model's print")


def test_triton_response_error_reaches_only_its_client(client: Client) -> None:
    before = _batch_sizes(client, "triton").get(2, 0)
    good, bad = _together(client, "triton", [1.0, 7.0])
    np.testing.assert_array_equal(good, np.full((1, 2), 2.0))
    assert isinstance(bad, InternalError) and str(bad) == "seven is not allowed"
    good, invalid = _together(client, "triton", [8.0, 2.0])[::-1]
    np.testing.assert_array_equal(good, np.full((1, 2), 3.0))
    assert isinstance(invalid, InvalidArgument) and "eight is invalid" in str(invalid)
    assert _batch_sizes(client, "triton").get(2, 0) >= before + 2  # the good and bad shared a batch


def test_triton_exception_fails_only_its_batch(client: Client) -> None:
    first, second = _together(client, "triton", [9.0, 1.0])
    for failed in (first, second):
        assert isinstance(failed, InternalError) and "nine breaks the batch" in str(failed)
    np.testing.assert_array_equal(client.infer("triton", _ab(1.0)).as_numpy("SUM"), np.full((1, 2), 2.0))


def test_triton_request_id_is_the_clients(client: Client) -> None:
    """``request.request_id()`` is the id the client gave its request, per request of a shared batch, and ""
    for a request without one (issue 14: EXECUTE did not carry it, so it was always "")."""
    before = _batch_sizes(client, "triton_id").get(2, 0)

    def one(request_id: str | None) -> list[list[bytes]]:
        return (
            client.infer("triton_id", {"A": np.ones((1, 2), np.float32)}, request_id=request_id)
            .as_numpy("ID")
            .tolist()
        )

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(one, ["client-id-1", "client-id-2"])
    assert (first, second) == ([[b"client-id-1"]], [[b"client-id-2"]])
    assert _batch_sizes(client, "triton_id").get(2, 0) >= before + 1  # the two shared a batch
    assert one(None) == [[b""]]


def test_bytes_model(client: Client) -> None:
    text = np.array([[b"zinfer serves text"], ["é à".encode()]], dtype=object)
    result = client.infer("text_upper", {"TEXT": text})
    assert result.as_numpy("UPPER").tolist() == [[b"ZINFER SERVES TEXT"], ["É À".encode()]]
    assert result.as_numpy("TOKENS").tolist() == [[3], [2]]


@pytest.mark.parametrize(
    "model, inputs, reasons",
    [
        ("bad_import", _ab(1.0), ["bad_import/1/model.py", "RuntimeError: no licence file", "(line 2)"]),
        (
            "bad_init",
            _ab(1.0),
            ["bad_init/1/model.py", "Model.initialize raised FileNotFoundError", "(line 3)"],
        ),
        ("no_weights", {"X": np.ones((1, 4), np.float32)}, ["no_weights/1/weights.npz not found"]),
        ("bad_config", _ab(1.0), ["bad_config/config.pbtxt", "max_batch_size"]),
    ],
)
def test_load_errors_are_contained_and_explained(
    client: Client, model: str, inputs: dict[str, np.ndarray], reasons: list[str]
) -> None:
    with pytest.raises(Unavailable) as info:
        client.infer(model, inputs)
    for reason in reasons:
        assert reason in str(info.value)
    entry = next(r for r in client.repository_index() if r["name"] == model)
    assert entry["state"] == "UNAVAILABLE"
    for reason in reasons:
        assert reason in entry["reason"]
    one = np.ones((1, 1), np.float32)
    assert client.infer("add", {"INPUT_A": one, "INPUT_B": one}).as_numpy("OUTPUT_SUM")[0, 0] == 2.0


def test_every_other_model_is_ready(client: Client) -> None:
    states = {r["name"]: r["state"] for r in client.repository_index()}
    assert {n for n, s in states.items() if s == "READY"} == {
        "add",
        "text_upper",
        "native",
        "triton",
        "triton_id",
    }


def test_a_model_that_fails_alone_in_its_own_server(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    _model(tmp_path, "only", _python(""), "raise SystemExit('bye')\n")
    server = server_factory(tmp_path)
    with Client(server.url, timeout=30) as c:
        assert c.is_server_live()
        with pytest.raises(Unavailable, match="import failed: SystemExit: bye"):
            c.infer("only", _ab(1.0))
