"""grpc_response: a reply written as bytes is the message grpc_convert.infer_response builds, byte for byte
where protobuf writes the same fields, field for field always."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from zinfer.client import dtypes
from zinfer.frontdoor import grpc_response
from zinfer.frontdoor.bridge_records import InferReply, Tensor
from zinfer.frontdoor.door_client import with_wire
from zinfer.frontdoor.grpc_convert import infer_response


def _reply(request_id: str = "", value: float = 1.0, model: str = "add", version: str = "1") -> InferReply:
    wire = dtypes.serialize_bytes(np.array([b"a", b"", b"xyz" * 50], dtype=object))
    return InferReply(
        model, version, request_id,
        (
            Tensor("SUM", "FP32", (2, 3), np.full((2, 3), value, np.float32)),
            Tensor("TEXT", "BYTES", (3,), with_wire(dtypes.deserialize_bytes(wire, (3,)), wire)),
            Tensor("EMPTY", "INT64", (0, 4), np.zeros((0, 4), np.int64)),
            Tensor("BIG", "UINT8", (300,), np.arange(300, dtype=np.uint16).astype(np.uint8)),
            Tensor("SCALAR", "INT32", (), np.array(7, np.int32)),
        ),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("request_id", "model", "version"),
    [("", "add", "1"), ("req-1", "add", "1"), ("é" * 200, "ünï", ""), ("x", "m" * 300, "12")],
)
def test_the_bytes_are_the_message_infer_response_builds(request_id: str, model: str, version: str) -> None:
    written: grpc_response.Written = {}
    for value in (1.0, 2.5):  # written, then from the kept kind of reply
        reply = _reply(request_id, value, model, version)
        data = grpc_response.response_bytes(reply, written)
        assert data is not None
        message = infer_response(reply)
        assert service_pb2.ModelInferResponse.FromString(data) == message
        assert data == message.SerializeToString()  # protobuf writes them in the same order
    assert len(written) == 1


def test_a_reply_with_parameters_or_a_negative_dim_is_left_to_the_message() -> None:
    reply = _reply()
    assert grpc_response.response_bytes(reply._replace(parameters={"p": 1}), {}) is None
    bad = reply._replace(outputs=(Tensor("X", "FP32", (-1,), np.zeros(0, np.float32)),))
    assert grpc_response.response_bytes(bad, {}) is None


def test_kinds_of_reply_are_told_apart_and_the_table_stays_bounded() -> None:
    written: grpc_response.Written = {}
    rng = random.Random(5)
    for i in range(grpc_response.MAX_KINDS * 2 + 3):
        n = rng.randrange(1, 4)
        reply = InferReply(
            f"m{i % 7}", str(i % 3), "", (Tensor(f"O{i % 5}", "FP32", (n,), np.ones(n, np.float32)),)
        )
        data = grpc_response.response_bytes(reply, written)
        assert data is not None and service_pb2.ModelInferResponse.FromString(data) == infer_response(reply)
        assert len(written) <= grpc_response.MAX_KINDS
