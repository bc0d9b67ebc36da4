"""Triton's quickstart repository's ONNX models, as stand-ins built with onnx.helper (nothing downloaded),
served by zinfer's front door to the real tritonclient, http and grpc, unchanged.

Each model folder is laid out and configured as in Triton's docs/examples/model_repository: ``densenet_onnx``
(``platform: "onnxruntime_onnx"``, ``max_batch_size: 1``, ``data_0`` FP32 [3, 224, 224] FORMAT_NCHW,
``fc6_1`` FP32 [1000] reshaped to [1000, 1, 1] with ``label_filename``), ``simple`` (INT32 [16] sum and
difference), ``simple_int8`` and ``simple_string`` (the same on strings of decimal numbers). The calls are
the ones Triton's example clients make: image_client.py's metadata and config checks and its request, and
simple_{http,grpc}_infer_client.py / simple_{http,grpc}_string_infer_client.py.

image_client.py asks for classification (``class_count``, 1 by default): Triton's classification extension,
answered by the front door as "<score>:<index>:<label>" strings from the output's ``label_filename``, read
and printed here as image_client.py's postprocess does, and checked against the tensor itself and NumPy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from onnx import TensorProto  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from tests.frontdoor_helpers import serve_front_doors  # noqa: E402
from tests.onnx_models import CLASSES, densenet_scores, densenet_standin, simple, simple_string  # noqa: E402

pytestmark = pytest.mark.integration

DENSENET = """name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 1
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""


def _simple_config(name: str, data_type: str) -> str:
    tensors = ",\n".join(
        f'  {{ name: "{n}" data_type: {data_type} dims: [ 16 ] }}' for n in ("INPUT0", "INPUT1")
    )
    outs = ",\n".join(
        f'  {{ name: "{n}" data_type: {data_type} dims: [ 16 ] }}' for n in ("OUTPUT0", "OUTPUT1")
    )
    head = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    return f"{head}input [\n{tensors}\n]\noutput [\n{outs}\n]\n"


def _repository(root: Path) -> Path:
    repo = root / "model_repository"
    densenet_standin(repo / "densenet_onnx" / "1" / "model.onnx")
    (repo / "densenet_onnx" / "config.pbtxt").write_text(DENSENET)
    labels = "".join(f"class {k}\n" for k in range(CLASSES))
    (repo / "densenet_onnx" / "densenet_labels.txt").write_text(labels)
    simple(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(_simple_config("simple", "TYPE_INT32"))
    simple(repo / "simple_int8" / "1" / "model.onnx", elem=TensorProto.INT8)
    (repo / "simple_int8" / "config.pbtxt").write_text(_simple_config("simple_int8", "TYPE_INT8"))
    simple_string(repo / "simple_string" / "1" / "model.onnx")
    (repo / "simple_string" / "config.pbtxt").write_text(_simple_config("simple_string", "TYPE_STRING"))
    return repo


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with serve_front_doors(_repository(tmp_path_factory.mktemp("quickstart"))) as urls:
        yield urls


@pytest.fixture
def http(door: tuple[str, str]) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(door[0], network_timeout=60.0)
    yield c
    c.close()


@pytest.fixture
def grpc(door: tuple[str, str]) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(door[1])
    yield c
    c.close()


def _image(seed: int) -> np.ndarray[Any, Any]:
    """One preprocessed image as image_client.py makes it: float32 [3, 224, 224], NCHW."""
    return np.random.default_rng(seed).random((3, 224, 224), dtype=np.float32) * 255.0 - 128.0


def test_image_client_model_checks_pass_over_http(http: httpclient.InferenceServerClient) -> None:
    # image_client.py's parse_model, HTTP flavour: JSON metadata and config
    metadata = http.get_model_metadata("densenet_onnx")
    config = http.get_model_config("densenet_onnx")
    assert len(metadata["inputs"]) == 1 and len(metadata["outputs"]) == 1
    assert metadata["inputs"][0]["name"] == "data_0" and metadata["outputs"][0]["name"] == "fc6_1"
    assert metadata["outputs"][0]["datatype"] == "FP32" and metadata["inputs"][0]["datatype"] == "FP32"
    assert config["max_batch_size"] == 1
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert metadata["inputs"][0]["shape"] == [-1, 3, 224, 224]
    assert metadata["outputs"][0]["shape"] == [-1, 1000]


def test_image_client_model_checks_pass_over_grpc(grpc: grpcclient.InferenceServerClient) -> None:
    from tritonclient.grpc import model_config_pb2 as mc

    metadata = grpc.get_model_metadata("densenet_onnx")
    config = grpc.get_model_config("densenet_onnx").config
    assert len(metadata.inputs) == 1 and len(metadata.outputs) == 1
    assert metadata.outputs[0].datatype == "FP32"
    assert config.max_batch_size == 1
    assert mc.ModelInput.Format.Name(config.input[0].format) == "FORMAT_NCHW"
    assert list(metadata.inputs[0].shape) == [-1, 3, 224, 224]
    assert config.output[0].label_filename == "densenet_labels.txt"


def _text(item: Any) -> str:
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _expected(scores: np.ndarray[Any, Any], count: int, labels: bool = True) -> list[list[str]]:
    """Triton's classification of [batch, classes] scores in NumPy: the top ``count`` per row, highest
    first, ties to the lower index, each "<value>:<index>[:<label>]" with the value as std::to_string."""
    rows = []
    for row in scores:
        best = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        rows.append([f"{float(row[k]):.6f}:{k}" + (f":class {k}" if labels else "") for k in best])
    return rows


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("classes", [1, 3])
def test_image_client_classification(
    protocol: str,
    classes: int,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    batch = np.stack([_image(1)], axis=0)  # max_batch_size 1: image_client.py stacks one image
    inp = mod.InferInput("data_0", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    result = client.infer("densenet_onnx", [inp], outputs=[mod.InferRequestedOutput("fc6_1")])
    scores = result.as_numpy("fc6_1")
    assert scores.shape == (1, CLASSES) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, densenet_scores(batch), rtol=1e-4, atol=1e-3)
    # image_client.py's request: binary_data=True over HTTP (the default), class_count=FLAGS.classes
    requested = mod.InferRequestedOutput("fc6_1", class_count=classes)
    classified = client.infer("densenet_onnx", [inp], outputs=[requested])
    output_array = classified.as_numpy("fc6_1")
    assert output_array.dtype == np.object_ and output_array.shape == (1, classes)
    assert [[_text(v) for v in row] for row in output_array] == _expected(scores, classes)
    # image_client.py's postprocess: one row per image, each "score:index:label" split on ':'
    printed = []
    for results in output_array:
        for result in results:
            cls = (
                "".join(chr(x) for x in result).split(":") if isinstance(result, bytes) else result.split(":")
            )
            printed.append(f"    {cls[0]} ({cls[1]}) = {cls[2]}")
    best = int(np.argsort(-scores[0].astype(np.float64), kind="stable")[0])
    assert printed[0] == f"    {float(scores[0][best]):.6f} ({best}) = class {best}"
    assert float(printed[0].split()[0]) == pytest.approx(float(densenet_scores(batch)[0].max()), abs=1e-3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_of_a_batch_of_two_without_labels(
    protocol: str, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """``simple`` batches (max_batch_size 8) and names no label file: [2, 16] INT32 sums give [2, 3]
    "value:index" strings, indices counted within each row (as JSON data over HTTP, not binary)."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    input0 = np.array([np.arange(16), np.arange(16)[::-1] % 5], dtype=np.int32)
    input1 = np.ones((2, 16), dtype=np.int32)
    inputs = [mod.InferInput("INPUT0", [2, 16], "INT32"), mod.InferInput("INPUT1", [2, 16], "INT32")]
    inputs[0].set_data_from_numpy(input0)
    inputs[1].set_data_from_numpy(input1)
    extra = {"binary_data": False} if protocol == "http" else {}
    outputs = [
        mod.InferRequestedOutput("OUTPUT0", class_count=3, **extra),
        mod.InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    sums = input0 + input1
    want = [
        [f"{int(row[k])}:{k}" for k in np.argsort(-row.astype(np.int64), kind="stable")[:3]] for row in sums
    ]
    assert [[_text(v) for v in row] for row in got] == want
    assert np.array_equal(result.as_numpy("OUTPUT1"), input0 - input1)  # the other output stays a tensor
    many = client.infer("simple", inputs, outputs=[mod.InferRequestedOutput("OUTPUT0", class_count=99)])
    assert many.as_numpy("OUTPUT0").shape == (2, 16)  # more than the classes: all of them


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_of_a_string_output_is_refused(
    protocol: str, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    data = np.array([[str(x).encode() for x in range(16)]], dtype=np.object_)
    inputs = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
    for i in inputs:
        i.set_data_from_numpy(data)
    refused = "class result not available for output due to unsupported type 'BYTES'"
    with pytest.raises(InferenceServerException, match=refused):
        client.infer("simple_string", inputs, outputs=[mod.InferRequestedOutput("OUTPUT0", class_count=1)])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "dtype", "datatype"), [("simple", np.int32, "INT32"), ("simple_int8", np.int8, "INT8")]
)
def test_simple_infer_client(
    protocol: str,
    model: str,
    dtype: Any,
    datatype: str,
    http: httpclient.InferenceServerClient,
    grpc: grpcclient.InferenceServerClient,
) -> None:
    """simple_{http,grpc}_infer_client.py: INPUT0 = 0..15, INPUT1 = ones, [1, 16]; OUTPUT0 the sum,
    OUTPUT1 the difference (over HTTP OUTPUT1 comes back as JSON, not binary)."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    input0 = np.expand_dims(np.arange(16, dtype=dtype), axis=0)
    input1 = np.ones((1, 16), dtype=dtype)
    inputs = [mod.InferInput("INPUT0", [1, 16], datatype), mod.InferInput("INPUT1", [1, 16], datatype)]
    if protocol == "http":
        inputs[0].set_data_from_numpy(input0, binary_data=False)
        inputs[1].set_data_from_numpy(input1, binary_data=True)
        outputs = [
            mod.InferRequestedOutput("OUTPUT0", binary_data=True),
            mod.InferRequestedOutput("OUTPUT1", binary_data=False),
        ]
    else:
        inputs[0].set_data_from_numpy(input0)
        inputs[1].set_data_from_numpy(input1)
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer(model, inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.dtype == dtype and out0.shape == (1, 16)
    assert np.array_equal(out0, input0 + input1) and np.array_equal(out1, input0 - input1)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_string_infer_client(
    protocol: str, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """simple_{http,grpc}_string_infer_client.py: the numbers as UTF-8 strings in an object array."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    data0 = np.expand_dims(np.array([str(x).encode("utf-8") for x in in0], dtype=np.object_), axis=0)
    data1 = np.expand_dims(np.array([str(x).encode("utf-8") for x in in1], dtype=np.object_), axis=0)
    inputs = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
    if protocol == "http":
        inputs[0].set_data_from_numpy(data0, binary_data=True)
        inputs[1].set_data_from_numpy(data1, binary_data=False)
    else:
        inputs[0].set_data_from_numpy(data0)
        inputs[1].set_data_from_numpy(data1)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert [int(v) for v in out0[0]] == list(in0 + in1)
    assert [int(v) for v in out1[0]] == list(in0 - in1)
