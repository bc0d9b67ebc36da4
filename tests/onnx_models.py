"""Tiny ONNX graphs built at test time with the ``onnx`` package's helpers (nothing downloaded or
committed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the projection of ``add_matmul``: small integers, so A @ W is exact in any summation order
WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6.0).astype(np.float32)


def _save(graph: onnx.GraphProto, path: Path, ir_version: int = 8, opset: int = 13) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


ADD_MATMUL_CONFIG = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },\n'
    '        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },\n'
    '         { name: "PROJ" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
)
"""The full config.pbtxt of :func:`add_matmul`'s graph."""


def add_matmul(path: Path, batch: int | str | None = "N", ir_version: int = 8) -> Path:
    """SUM = A + B and PROJ = A @ W for float32 A, B of shape [batch, 4] (W a [4, 3] initializer).

    ``batch`` is the leading dim: a name (symbolic, so the model can take a batch) or a fixed size. With
    ``ir_version`` < 4 the initializer W is also listed among the graph's inputs, as old exporters did.
    """
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [batch, 4])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [batch, 4])
    total = helper.make_tensor_value_info("SUM", TensorProto.FLOAT, [batch, 4])
    proj = helper.make_tensor_value_info("PROJ", TensorProto.FLOAT, [batch, 3])
    w = numpy_helper.from_array(WEIGHTS, "W")
    inputs = [a, b]
    if ir_version < 4:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]))
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["SUM"]), helper.make_node("MatMul", ["A", "W"], ["PROJ"])],
        "add_matmul",
        inputs,
        [total, proj],
        initializer=[w],
    )
    return _save(graph, path, ir_version)


def int_identity(path: Path) -> Path:
    """OUT = Identity(IN) for int64 IN of fixed shape [2, 3] (no batch dim)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "int_identity",
        [helper.make_tensor_value_info("IN", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("OUT", TensorProto.INT64, [2, 3])],
    )
    return _save(graph, path)


def string_identity(path: Path) -> Path:
    """OUT = Identity(TEXT) for a string TEXT of shape [batch, -1]: TYPE_STRING in and out."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["OUT"])],
        "string_identity",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["N", "L"])],
        [helper.make_tensor_value_info("OUT", TensorProto.STRING, ["N", "L"])],
    )
    return _save(graph, path)


def simple(path: Path, elem: int = TensorProto.INT32, batch: int | str = "N") -> Path:
    """Triton's quickstart ``simple`` (and ``simple_int8`` with ``elem=TensorProto.INT8``) as an ONNX graph:
    OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, every tensor [batch, 16]."""
    shape: list[int | str] = [batch, 16]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _save(graph, path, opset=14)  # Add and Sub take int8 from opset 14


def simple_string(path: Path) -> Path:
    """Triton's quickstart ``simple_string`` as an ONNX graph: string tensors [batch, 16] holding decimal
    integers; OUTPUT0 the sum and OUTPUT1 the difference, as strings (Cast string -> int32 -> string)."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
        helper.make_node("Add", ["A", "B"], ["SUM"]),
        helper.make_node("Sub", ["A", "B"], ["DIFF"]),
        helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    shape: list[int | str] = ["N", 16]
    graph = helper.make_graph(
        nodes,
        "simple_string",
        [helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _save(graph, path)


# the stand-in classifier's 1x1 convolution: class k scores 3 colour means with small integer weights
CLASSES = 1000
CLASSIFIER = ((np.arange(CLASSES * 3).reshape(CLASSES, 3, 1, 1) % 7) - 3.0).astype(np.float32)


def densenet_standin(path: Path, batch: int | str = "N") -> Path:
    """A stand-in with the signature of Triton's quickstart ``densenet_onnx``: ``data_0`` float32
    [N, 3, 224, 224] in, ``fc6_1`` float32 [N, 1000, 1, 1] out (``batch=1``: [1, ...], as the downloaded
    densenet-7 model has). fc6_1 = Conv1x1(GlobalAveragePool(data_0)), the weights :data:`CLASSIFIER`, so
    a test can compute the scores with NumPy."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "W"], ["fc6_1"], kernel_shape=[1, 1]),
        ],
        "densenet_standin",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [batch, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [batch, CLASSES, 1, 1])],
        initializer=[numpy_helper.from_array(CLASSIFIER, "W")],
    )
    return _save(graph, path)


def densenet_scores(images: np.ndarray) -> np.ndarray:
    """What :func:`densenet_standin` computes, in NumPy: [N, 1000] scores for [N, 3, 224, 224] images."""
    means = images.astype(np.float64).mean(axis=(2, 3))
    return (means @ CLASSIFIER.reshape(CLASSES, 3).T.astype(np.float64)).astype(np.float32)
