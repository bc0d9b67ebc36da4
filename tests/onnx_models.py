"""Tiny ONNX graphs built at test time with the ``onnx`` package's helpers (nothing downloaded or
committed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# the projection of ``add_matmul``: small integers, so A @ W is exact in any summation order
WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6.0).astype(np.float32)


def _save(graph: onnx.GraphProto, path: Path, ir_version: int = 8) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


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
