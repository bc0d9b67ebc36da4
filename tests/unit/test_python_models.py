"""Model code in-process: the worker's loader and batch runner on model.py files, with inline frames."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.gpu import fake_cupy
from zinfer.client import dtypes
from zinfer.client.errors import ConfigError
from zinfer.client.protocol import OutputRequest, TensorRef
from zinfer.client.worker_protocol import request_result_to_wire
from zinfer.modelconfig.model_config import ModelConfig, load_model_config, parse_model_config
from zinfer.modelconfig.sequence_batching import control_specs
from zinfer.modelconfig.signature import Signature
from zinfer.workers import triton_python_backend_utils as pb
from zinfer.workers.batch import BatchRequest
from zinfer.workers.device import open_device
from zinfer.workers.loader import load_model
from zinfer.workers.model import AnyModel
from zinfer.workers.regions import RegionCache
from zinfer.workers.runners import run_once

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture(autouse=True)
def _restore_import_state() -> Iterator[None]:
    """Loading a model.py puts its folder on sys.path and its module in sys.modules: undo both."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def _load(
    tmp_path: Path, code: str, config: str = CONFIG, device: str = "cpu"
) -> tuple[AnyModel, ModelConfig]:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(textwrap.dedent(code))
    parsed = parse_model_config(config, source="test", model_name="m")
    return load_model(parsed, version, open_device(device), instance=0), parsed


def _request(
    rid: int, rows: int, frames: list[Any], value: float, outputs: tuple[str, ...] = ("SUM", "DIFF")
) -> BatchRequest:
    refs = []
    for name, v in (("A", value), ("B", 1.0)):
        frames.append(np.full((rows, 2), v, np.float32).tobytes())
        refs.append(TensorRef(name, "FP32", (rows, 2), frame=len(frames) - 1))
    return BatchRequest(rid, tuple(refs), tuple(OutputRequest(o) for o in outputs), request_id=f"req-{rid}")


def _run(model: AnyModel, config: ModelConfig, reqs: list[BatchRequest], frames: list[Any]) -> Any:
    return run_once(model, Signature.of(config), reqs, frames, RegionCache())


def _output(outcome: Any, rid: int, name: str = "SUM") -> np.ndarray:
    res = next(request_result_to_wire(r) for r in outcome.results if r.id == rid)
    assert res["status"] == 0, res
    t = next(t for t in res["outputs"] if t["name"] == name)
    data = outcome.frames[t["frame"]]
    if t["datatype"] == dtypes.BYTES:
        return dtypes.deserialize_bytes(data, t["shape"])
    return np.frombuffer(data, dtypes.wire_to_numpy(t["datatype"])).reshape(t["shape"])


def _error(outcome: Any, rid: int) -> dict[str, Any]:
    res = next(request_result_to_wire(r) for r in outcome.results if r.id == rid)
    assert res["status"] != 0, res
    return res


NATIVE = """
    import numpy as np
    SEEN = []

    class Model:
        def initialize(self, config):
            SEEN.append(("init", config))

        def execute(self, inputs):
            SEEN.append(("batch", inputs["A"].shape))
            return {"SUM": inputs["A"] + inputs["B"], "DIFF": inputs["A"] - inputs["B"]}

        def finalize(self):
            SEEN.append(("finalize", None))
"""


def test_native_model_gets_the_whole_batch_and_its_config(tmp_path: Path) -> None:
    model, config = _load(tmp_path, NATIVE)
    seen = sys.modules["zinfer_model_m_1"].SEEN
    init = seen[0][1]
    assert init["name"] == "m" and init["max_batch_size"] == 8 and init["input"][0]["name"] == "A"
    assert init["device"] == "cpu" and init["device_kind"] == "CPU" and init["device_id"] == 0
    assert init["model_version"] == 1 and init["version_dir"] == str(tmp_path / "m" / "1")
    frames: list[Any] = []
    out = _run(model, config, [_request(1, 1, frames, 1.0), _request(2, 3, frames, 2.0)], frames)
    assert seen[1] == ("batch", (4, 2))  # one call for both requests, concatenated
    np.testing.assert_array_equal(_output(out, 1), np.full((1, 2), 2.0))
    np.testing.assert_array_equal(_output(out, 2, "DIFF"), np.full((3, 2), 1.0))
    model.finalize()
    assert seen[-1] == ("finalize", None)


def test_native_model_class_may_have_another_name_and_no_hooks(tmp_path: Path) -> None:
    code = """
        class Doubler:
            def execute(self, inputs):
                return {"SUM": inputs["A"] * 2, "DIFF": inputs["B"] * 0}

        class Helper:
            pass
    """
    model, config = _load(tmp_path, code)
    frames: list[Any] = []
    out = _run(model, config, [_request(1, 2, frames, 3.0)], frames)
    np.testing.assert_array_equal(_output(out, 1), np.full((2, 2), 6.0))
    model.finalize()


def test_native_model_failures_fail_the_batch(tmp_path: Path) -> None:
    code = """
        class Model:
            def execute(self, inputs):
                if inputs["A"][0, 0] > 5:
                    raise ValueError("too big")
                return {"SUM": inputs["A"], "DIFF": inputs["A"].astype("float64")}
    """
    model, config = _load(tmp_path, code)
    frames: list[Any] = []
    out = _run(model, config, [_request(1, 1, frames, 9.0), _request(2, 1, frames, 9.0)], frames)
    assert all("model raised ValueError: too big" in _error(out, i)["error"] for i in (1, 2))
    frames = []
    out = _run(model, config, [_request(3, 1, frames, 1.0)], frames)
    assert "output 'DIFF' has dtype float64" in _error(out, 3)["error"]


def test_bytes_model_text_upper(tmp_path: Path) -> None:
    config = load_model_config(MODELS / "text_upper" / "config.pbtxt", "text_upper")
    model = load_model(config, MODELS / "text_upper" / "1")
    frames: list[Any] = []
    reqs = []
    for rid, words in ((1, [b"hello world"]), (2, ["grüße dich, welt".encode(), b""])):
        arr = np.empty((len(words), 1), dtype=object)
        arr[:, 0] = words
        frames.append(dtypes.serialize_bytes(arr))
        reqs.append(
            BatchRequest(
                rid,
                (TensorRef("TEXT", "BYTES", arr.shape, frame=len(frames) - 1),),
                (OutputRequest("UPPER"), OutputRequest("TOKENS")),
            )
        )
    out = _run(model, config, reqs, frames)
    assert _output(out, 1, "UPPER").tolist() == [[b"HELLO WORLD"]]
    assert _output(out, 2, "UPPER").tolist() == [["GRÜSSE DICH, WELT".encode()], [b""]]
    assert _output(out, 2, "TOKENS").tolist() == [[3], [0]]


def test_native_model_on_a_gpu_gets_device_arrays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = fake_cupy.install(monkeypatch)
    code = """
        import cupy
        import numpy as np
        KINDS = []

        class Model:
            def initialize(self, config):
                KINDS.append(config["device"])

            def execute(self, inputs):
                KINDS.append(type(inputs["A"]).__name__)
                total = cupy.add(inputs["A"], inputs["B"])
                return {"SUM": total, "DIFF": np.zeros(inputs["A"].shape, np.float32)}  # NumPy is fine too
    """
    model, config = _load(tmp_path, code, device="gpu:1")
    frames: list[Any] = []
    out = run_once(
        model,
        Signature.of(config),
        [_request(1, 2, frames, 4.0)],
        frames,
        RegionCache(),
        open_device("gpu:1"),
    )
    assert sys.modules["zinfer_model_m_1"].KINDS == ["gpu:1", cupy.ndarray.__name__]
    np.testing.assert_array_equal(_output(out, 1), np.full((2, 2), 5.0))
    np.testing.assert_array_equal(_output(out, 1, "DIFF"), np.zeros((2, 2)))


# -------------------------------------------------------------------------------------- load errors


@pytest.mark.parametrize(
    "code, message",
    [
        (
            "import numpy\nx = 1 / 0\n",
            r"model.py: import failed: ZeroDivisionError: division by zero \(line 2\)",
        ),
        ("def broken(:\n", r"model.py: import failed: SyntaxError: .*\(line 1\)"),
        (
            "import no_such_module_zz\n",
            r"import failed: ModuleNotFoundError: No module named 'no_such_module_zz'",
        ),
        ("import sys\nsys.exit(3)\n", r"import failed: SystemExit: 3"),
        (
            "class Model:\n    def initialize(self, config):\n        raise KeyError('weights')\n"
            "    def execute(self, inputs):\n        return {}\n",
            r"model.py: Model.initialize raised KeyError: 'weights' \(line 3\)",
        ),
        (
            "class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise RuntimeError('no GPU')\n"
            "    def execute(self, requests):\n        return []\n",
            r"TritonPythonModel.initialize raised RuntimeError: no GPU \(line 3\)",
        ),
        ("X = 1\n", r"cannot tell which class is the model.*found: none"),
        (
            "class A:\n    def execute(self, i): pass\nclass B:\n    def execute(self, i): pass\n",
            r"cannot tell which class is the model.*found: A, B",
        ),
    ],
)
def test_load_errors_name_the_file_the_exception_and_the_line(
    tmp_path: Path, code: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _load(tmp_path, code)
    assert str(tmp_path / "m" / "1" / "model.py") in str(info.value)


def test_missing_model_file(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    config = parse_model_config(CONFIG, source="t", model_name="m")
    with pytest.raises(ConfigError, match=r"needs .*1/model.py: not found"):
        load_model(config, tmp_path / "1")


# ------------------------------------------------------------------------------------- Triton style

TRITON = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    ARGS = []
    CALLS = []

    class TritonPythonModel:
        def initialize(self, args):
            ARGS.append(args)
            config = json.loads(args["model_config"])
            sum_config = pb_utils.get_output_config_by_name(config, "SUM")
            self.dtype = pb_utils.triton_string_to_numpy(sum_config["data_type"])

        def execute(self, requests):
            CALLS.append([r.request_id() for r in requests])
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
                print("request", request.request_id(), a.shape, request.requested_output_names())
                if a[0, 0] == 7:
                    error = pb_utils.TritonError("seven is not allowed")
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                if a[0, 0] == 8:
                    error = pb_utils.TritonError("eight is invalid", pb_utils.TritonError.INVALID_ARG)
                    responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                    continue
                if a[0, 0] == 9:
                    raise pb_utils.TritonModelException("nine breaks everything")
                if a[0, 0] == 10:
                    return responses  # one short
                if a[0, 0] == 11:
                    total = pb_utils.Tensor("SUM", (a + b).astype(self.dtype))
                    responses.append(pb_utils.InferenceResponse([total]))
                    continue
                total = pb_utils.Tensor("SUM", (a + b).astype(self.dtype))
                out = [total, pb_utils.Tensor("DIFF", (a - b).astype(self.dtype))]
                responses.append(pb_utils.InferenceResponse(output_tensors=out))
            return responses

        def finalize(self):
            print("bye")
"""


def test_triton_model_runs_request_by_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, config = _load(tmp_path, TRITON)
    module = sys.modules["zinfer_model_m_1"]
    args = module.ARGS[0]
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_name"] == "m" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "m")
    assert json.loads(args["model_config"])["max_batch_size"] == 8
    frames: list[Any] = []
    reqs = [_request(1, 1, frames, 1.0), _request(2, 3, frames, 2.0, outputs=("DIFF",))]
    out = _run(model, config, reqs, frames)
    assert module.CALLS == [["req-1", "req-2"]]  # one execute for the batch
    printed = capsys.readouterr().out
    assert "request req-1 (1, 2) ['SUM', 'DIFF']" in printed and "request req-2 (3, 2) ['DIFF']" in printed
    np.testing.assert_array_equal(_output(out, 1), np.full((1, 2), 2.0))
    np.testing.assert_array_equal(_output(out, 2, "DIFF"), np.full((3, 2), 1.0))
    model.finalize()
    assert "bye" in capsys.readouterr().out


def test_triton_response_errors_reach_only_their_request(tmp_path: Path) -> None:
    model, config = _load(tmp_path, TRITON)
    frames: list[Any] = []
    reqs = [
        _request(1, 1, frames, 1.0),
        _request(2, 1, frames, 7.0),
        _request(3, 1, frames, 8.0),
        _request(4, 2, frames, 11.0),
    ]
    out = _run(model, config, reqs, frames)
    np.testing.assert_array_equal(_output(out, 1), np.full((1, 2), 2.0))
    assert _error(out, 2) == {"id": 2, "status": 9, "error": "InternalError: seven is not allowed"}
    assert _error(out, 3) == {"id": 3, "status": 1, "error": "InvalidArgument: eight is invalid"}
    assert "response has no output named 'DIFF'" in _error(out, 4)["error"]


@pytest.mark.parametrize(
    "value, message",
    [
        (9.0, "Failed to process the request(s) for model 'm', message: TritonModelException: nine breaks"),
        (
            10.0,
            "returned 1 responses for 2 requests: it must return exactly one InferenceResponse per request",
        ),
    ],
)
def test_triton_execute_failures_fail_the_whole_batch(tmp_path: Path, value: float, message: str) -> None:
    model, config = _load(tmp_path, TRITON)
    frames: list[Any] = []
    out = _run(model, config, [_request(1, 1, frames, 1.0), _request(2, 1, frames, value)], frames)
    assert all(message in _error(out, i)["error"] for i in (1, 2))
    assert out.frames == []


def test_triton_execute_returning_none_or_junk(tmp_path: Path) -> None:
    code = """
        class TritonPythonModel:
            def execute(self, requests):
                return None if len(requests) == 1 else ["not a response"] * len(requests)
    """
    model, config = _load(tmp_path, code)
    frames: list[Any] = []
    out = _run(model, config, [_request(1, 1, frames, 1.0)], frames)
    assert "returned None" in _error(out, 1)["error"]
    out = _run(model, config, [_request(2, 1, frames, 1.0), _request(3, 1, frames, 1.0)], frames)
    assert "returned a str where an InferenceResponse was expected" in _error(out, 2)["error"]


def test_add_sub_triton_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_model_config(MODELS / "add_sub_triton" / "config.pbtxt", "add_sub_triton")
    model = load_model(config, MODELS / "add_sub_triton" / "1")
    frames = [np.arange(8, dtype=np.float32).tobytes(), np.ones(8, np.float32).tobytes()]
    req = BatchRequest(
        1,
        (TensorRef("INPUT0", "FP32", (2, 4), frame=0), TensorRef("INPUT1", "FP32", (2, 4), frame=1)),
        (OutputRequest("OUTPUT0"), OutputRequest("OUTPUT1")),
    )
    out = _run(model, config, [req], frames)
    np.testing.assert_array_equal(_output(out, 1, "OUTPUT0"), np.arange(8).reshape(2, 4) + 1)
    np.testing.assert_array_equal(_output(out, 1, "OUTPUT1"), np.arange(8).reshape(2, 4) - 1)
    assert "add_sub_triton: request" in capsys.readouterr().out
    model.finalize()


TRITON_SEQUENCE = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    SEEN = []

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for r in requests:
                controls = {}
                for n in ("START", "END", "READY", "CORRID"):
                    t = pb_utils.get_input_tensor_by_name(r, n)
                    controls[n] = None if t is None else t.as_numpy().tolist()
                SEEN.append((controls, r.correlation_id(), r.flags()))
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            return responses
"""

SEQUENCE_CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


def test_triton_sequence_requests_carry_their_controls_correlation_id_and_flags(tmp_path: Path) -> None:
    model, config = _load(tmp_path, TRITON_SEQUENCE, SEQUENCE_CONFIG)
    assert config.sequence_batching is not None
    controls = control_specs(config.sequence_batching)
    frames: list[Any] = []
    reqs = []
    for rid, (sid, start, end) in enumerate([(5, True, False), (6, False, False), (7, False, True)], 1):
        frames.append(np.full((1, 1), rid, np.float32).tobytes())
        sequence = {"id": sid, "start": start, "end": end, "controls": controls}
        x = TensorRef("X", "FP32", (1, 1), frame=len(frames) - 1)
        reqs.append(BatchRequest(rid, (x,), (OutputRequest("Y"),), f"r{rid}", sequence))
    out = _run(model, config, reqs, frames)
    for rid in (1, 2, 3):
        np.testing.assert_array_equal(_output(out, rid, "Y"), [[rid]])
    seen = sys.modules["zinfer_model_m_1"].SEEN
    assert seen == [  # each request its own [1, 1] controls, as Triton gives them
        ({"START": [[1]], "END": [[0.0]], "READY": [[True]], "CORRID": [[5]]}, 5, 1),
        ({"START": [[0]], "END": [[0.0]], "READY": [[True]], "CORRID": [[6]]}, 6, 0),
        ({"START": [[0]], "END": [[1.0]], "READY": [[True]], "CORRID": [[7]]}, 7, 2),
    ]
    seen.clear()
    plain = BatchRequest(9, (TensorRef("X", "FP32", (1, 1), frame=0),), (OutputRequest("Y"),))
    _output(_run(model, config, [plain], frames), 9, "Y")
    assert seen == [(dict.fromkeys(("START", "END", "READY", "CORRID")), 0, 0)]  # not in a sequence


# --------------------------------------------------------------------------------- pb_utils helpers


def test_pb_utils_helpers(caplog: pytest.LogCaptureFixture) -> None:
    assert pb.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb.triton_string_to_numpy("TYPE_STRING") is np.object_
    with pytest.raises(pb.TritonModelException):
        pb.triton_string_to_numpy("TYPE_NOPE")
    config = {
        "input": [{"name": "A", "data_type": "TYPE_FP32"}],
        "output": [{"name": "Y", "data_type": "TYPE_INT8"}],
    }
    assert pb.get_output_config_by_name(config, "Y") == {"name": "Y", "data_type": "TYPE_INT8"}
    assert pb.get_output_config_by_name(json.dumps(config), "Z") is None
    assert pb.get_input_config_by_name(config, "A") == {"name": "A", "data_type": "TYPE_FP32"}
    t = pb.Tensor("Y", np.arange(3))
    assert t.name() == "Y" and t.shape() == [3] and t.is_cpu()
    assert pb.Tensor.from_dlpack("Z", np.arange(2)).as_numpy().tolist() == [0, 1]
    response = pb.InferenceResponse([t])
    assert pb.get_output_tensor_by_name(response, "Y") is t and not response.has_error()
    request = pb.InferenceRequest([t], request_id="r", requested_output_names=["Y"])
    assert (
        pb.get_input_tensor_by_name(request, "Y") is t and pb.get_input_tensor_by_name(request, "X") is None
    )
    answer = request.exec()  # BLS outside a served worker: the error comes back as a value, as in Triton
    assert answer.has_error() and "server" in answer.error().message()
    with caplog.at_level("DEBUG", logger="triton_python_backend_utils"):
        pb.Logger.log_info("hello")
        pb.Logger.log_warn("careful")
        pb.Logger.log_error("bad")
        pb.Logger.log_verbose("details")
    assert [r.getMessage() for r in caplog.records] == ["hello", "careful", "bad", "details"]
