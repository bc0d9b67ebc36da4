"""frontdoor/http_codec.py and http_reply.py: the KServe v2 HTTP inference body, JSON and Triton's binary-data
extension, decoded and encoded as pure functions; every malformed body is a clear InvalidArgument (400),
never another exception, never a hang (the fuzz tests at the end)."""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor.bridge_records import InferReply, Tensor
from zinfer.frontdoor.http_codec import (
    HttpInferRequest,
    InputSpec,
    Limits,
    ShmRef,
    decode_infer_request,
    parse_header_length,
    resolve_inputs,
)
from zinfer.frontdoor.http_reply import encode_infer_reply

LIMITS = Limits(max_tensor_bytes=1 << 20, max_json_bytes=1 << 20)


def _body(head: dict[str, Any], *parts: bytes) -> tuple[bytes, int | None]:
    text = json.dumps(head).encode()
    return text + b"".join(parts), (len(text) if parts else None)


def _decode(head: dict[str, Any], *parts: bytes, limits: Limits = LIMITS) -> HttpInferRequest:
    body, length = _body(head, *parts)
    return decode_infer_request(body, length, "m", limits)


def _one(datatype: str, shape: list[Any], **fields: Any) -> dict[str, Any]:
    """A request with one input ``A``."""
    return {"inputs": [{"name": "A", "datatype": datatype, "shape": shape, **fields}]}


def _bin(datatype: str, shape: list[Any], size: Any) -> dict[str, Any]:
    return _one(datatype, shape, parameters={"binary_data_size": size})


def _refused(head: Any, *parts: bytes, match: str, header: int | None = None) -> None:
    text = head if isinstance(head, bytes) else json.dumps(head).encode()
    body = text + b"".join(parts)
    length = header if header is not None else (len(text) if parts else None)
    with pytest.raises(InvalidArgument, match=match):
        decode_infer_request(body, length, "m", LIMITS)


def test_json_tensors_of_each_kind() -> None:
    req = _decode({
        "id": "r1",
        "inputs": [
            {"name": "F", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2.5], [3, 4]]},
            {"name": "I", "datatype": "INT8", "shape": [3], "data": [-128, 0, 127]},
            {"name": "B", "datatype": "BOOL", "shape": [2], "data": [True, False]},
            {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
        ],
        "outputs": [{"name": "O", "parameters": {"binary_data": True}}, {"name": "P"}],
        "parameters": {"priority": 2, "timeout": 500, "sequence_id": 7, "sequence_start": True, "extra": 1.5},
    })  # fmt: skip
    f, i, b, s = req.inputs
    assert f.data is not None and f.data.dtype == np.float32 and f.data.tolist() == [[1, 2.5], [3, 4]]
    assert i.data is not None and i.data.dtype == np.int8 and i.data.tolist() == [-128, 0, 127]
    assert b.data is not None and b.data.tolist() == [True, False]
    assert s.data is not None and s.data.tolist() == ["héllo".encode(), b""]
    assert req.request_id == "r1" and (req.priority, req.timeout_us) == (2, 500)
    assert (req.sequence_id, req.sequence_start, req.sequence_end) == (7, True, False)
    assert req.parameters == {"extra": 1.5}
    assert [(o.name, o.binary) for o in req.outputs] == [("O", True), ("P", None)]


def test_binary_tensors_follow_the_json_in_input_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    bf = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    text = struct.pack("<I", 3) + b"abc" + struct.pack("<I", 0)
    req = _decode(
        {"inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": a.nbytes}},
            {"name": "BF", "datatype": "BF16", "shape": [2], "parameters": {"binary_data_size": 4}},
            {"name": "T", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(text)}},
        ], "parameters": {"sequence_id": "corr-1", "binary_data_output": True}},
        a.tobytes(), bf.tobytes(), text,
    )  # fmt: skip
    got = {i.name: i.data for i in req.inputs}
    assert got["A"] is not None and np.array_equal(got["A"], a)
    assert (
        got["BF"] is not None and got["BF"].dtype == ml_dtypes.bfloat16 and got["BF"].tolist() == [1.5, -2.0]
    )
    assert got["T"] is not None and got["T"].tolist() == [b"abc", b""]
    assert req.sequence_id == "corr-1" and req.binary_output is True


def test_shared_memory_inputs_are_read_through_the_reader() -> None:
    req = _decode({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "parameters": {
        "shared_memory_region": "r", "shared_memory_offset": 8, "shared_memory_byte_size": 8}}]})  # fmt: skip
    assert req.inputs[0].shm == ShmRef("r", 8, 8)
    calls = []

    def read(region: str, offset: int, size: int) -> np.ndarray[Any, Any]:
        calls.append((region, offset, size))
        return np.array([5, 6], dtype=np.int32).view(np.uint8)

    (x,) = resolve_inputs(req, read, LIMITS)
    assert calls == [("r", 8, 8)] and x.data.tolist() == [5, 6]
    with pytest.raises(InvalidArgument, match="unexpected total byte size 4"):
        resolve_inputs(req, lambda *a: np.zeros(4, np.uint8), LIMITS)
    big = HttpInferRequest(
        "", (InputSpec("X", "INT8", (2,), shm=ShmRef("r", 0, LIMITS.max_tensor_bytes + 1)),)
    )
    with pytest.raises(InvalidArgument, match="more than the limit"):
        resolve_inputs(big, read, LIMITS)
    assert len(calls) == 1  # the oversized one was refused before any read


@pytest.mark.parametrize(
    "head,parts,match",
    [
        (b"{not json", (), "failed to parse the request JSON buffer"),
        (b"[1, 2]", (), "Unable to parse 'request'"),
        (b"[" * 100000 + b"]" * 100000, (), "failed to parse the request JSON buffer"),
        ({"inputs": "x"}, (), "Unable to parse 'inputs'"),
        ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1]}]}, (), "But no field is set"),
        (_one("FP32", [1], data=[1], parameters={"binary_data_size": 4}), (b"xxxx",),
         "'data' 'binary_data_size'"),
        ({"inputs": [{"name": 3, "datatype": "FP32", "shape": [1], "data": [1]}]}, (), "parse 'name'"),
        (_one("FP128", [1], data=[1]), (), "invalid datatype"),
        (_one("FP32", [-1], data=[1]), (), "Unable to parse 'shape'"),
        (_one("FP32", [1.5], data=[1]), (), "Unable to parse 'shape'"),
        (_one("FP32", [1] * 40, data=[1]), (), "dimensions"),
        (_one("FP32", [2], data=[1]), (), "Shape does not match"),
        (_one("FP32", [1], data=["1"]), (), "Unable to parse 'data'"),
        (_one("INT8", [1], data=[300]), (), "does not fit INT8"),
        (_one("INT32", [1], data=[1.5]), (), "Unable to parse 'data'"),
        (_one("BF16", [1], data=[1]), (), "BF16 data via JSON"),
        (_one("FP32", [1 << 40], data=[]), (), "--max-tensor-bytes"),
        (_one("FP32", [1 << 31, 1 << 31, 1 << 31], data=[]), (), "--max-tensor-bytes"),
        (_one("FP32", [0, 18234169, 126457257757], data=[]), (), "--max-tensor-bytes"),  # found by fuzzing
        (_bin("FP32", [1], 8),  (b"1234",), "expecting 4 additional bytes for model 'm'"),
        (_bin("FP32", [1], -1),  (b"1234",), "Unable to parse 'binary_data_size'"),
        (_bin("FP32", [1], 1 << 62),  (b"1234",), "over the limit"),
        (_bin("FP32", [2], 4),  (b"1234",), "unexpected total byte size 4 for input 'A', expecting 8"),
        (_bin("FP32", [1], 4),  (b"12345678",), "unexpected additional input data for model 'm'"),
        (_bin("BYTES", [1], 4),  (struct.pack("<I", 99),), "input 'A'"),
        ({"inputs": [], "parameters": {"triton_x": 1}}, (), "reserved for Triton"),
        ({"inputs": [], "parameters": {"priority": -1}}, (), "Unable to parse 'priority'"),
        ({"inputs": [], "parameters": {"sequence_start": 1}}, (), "Unable to parse 'sequence_start'"),
        ({"inputs": [], "parameters": {"x": [1]}}, (), "has invalid type"),
        ({"inputs": [], "id": 5}, (), "Unable to parse 'id'"),
        ({"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": -1}}]}, (), "classificat"),
        ({"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": 1,
                                                                  "shared_memory_region": "r"}}]},
         (), "cannot be written to shared memory"),
        ({"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": True,
                                                                  "shared_memory_region": "r"}}]},
         (), "can't set both"),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused_with_a_clear_text(
    head: Any, parts: tuple[bytes, ...], match: str
) -> None:
    _refused(head, *parts, match=match)


def test_the_header_length_header() -> None:
    assert parse_header_length(None, 10) is None
    assert parse_header_length(" 7 ", 10) == 7
    for bad in ("x", "-1", "1e3", "9" * 30, "²", "１２"):  # digits int() rejects, or other than ASCII
        with pytest.raises(InvalidArgument, match="Unable to parse Inference-Header-Content-Length"):
            parse_header_length(bad, 10)
    with pytest.raises(InvalidArgument, match=r"should be in range \(0, 10\), got: 11"):
        parse_header_length("11", 10)
    with pytest.raises(InvalidArgument, match="raw binary request"):
        decode_infer_request(b"abcd", 0, "m", LIMITS)
    with pytest.raises(InvalidArgument, match="JSON is"):
        decode_infer_request(b" " * 100, None, "m", Limits(max_json_bytes=50))


def test_reply_json_binary_and_shared_memory_outputs() -> None:
    f = np.array([[1.5, 2.0]], dtype=np.float32)
    s = np.array([b"ab", b"\xff"], dtype=object)
    bf = np.array([1.0], dtype=ml_dtypes.bfloat16)
    reply = InferReply(
        "m",
        "1",
        "",
        (Tensor("F", "FP32", (1, 2), f), Tensor("S", "BYTES", (2,), s), Tensor("BF", "BF16", (1,), bf)),
    )
    req = _decode({"id": "q", "inputs": [], "outputs": [
        {"name": "F"}, {"name": "S", "parameters": {"binary_data": True}},
        {"name": "BF", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 2}},
    ]})  # fmt: skip
    out = encode_infer_reply(reply, req, frozenset({"BF"}))
    head = json.loads(out.json)
    assert head["id"] == "q" and head["model_name"] == "m" and head["model_version"] == "1"
    assert head["outputs"][0] == {"name": "F", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}
    size = 4 + 2 + 4 + 1
    assert head["outputs"][1] == {
        "name": "S",
        "datatype": "BYTES",
        "shape": [2],
        "parameters": {"binary_data_size": size},
    }
    assert head["outputs"][2] == {"name": "BF", "datatype": "BF16", "shape": [1]}
    assert out.header_length == len(out.json) and out.content_length == len(out.json) + size
    assert b"".join(out.binary) == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"\xff"
    # all outputs when none is named; binary_data_output decides; BF16 cannot go as JSON
    every = encode_infer_reply(reply, _decode({"inputs": [], "parameters": {"binary_data_output": True}}))
    assert [o["parameters"]["binary_data_size"] for o in json.loads(every.json)["outputs"]] == [8, size, 2]
    with pytest.raises(InvalidArgument, match="sending BF16 data via JSON is not supported"):
        encode_infer_reply(reply, _decode({"inputs": []}))


def test_non_finite_outputs_are_null_in_json_data_and_exact_in_binary() -> None:
    """A JSON reply never holds a bare NaN or Infinity (not JSON); binary data keeps the exact values."""
    values = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    for datatype, data in (("FP32", values), ("FP64", values.astype(np.float64))):
        reply = InferReply("m", "1", "", (Tensor("F", datatype, (4,), data),))

        def refuse(name: str) -> None:
            raise AssertionError(f"not JSON: {name}")

        as_json = json.loads(encode_infer_reply(reply, _decode({"inputs": []})).json, parse_constant=refuse)
        assert as_json["outputs"][0]["data"] == [None, None, None, 1.5]
        as_binary = _decode({"inputs": [], "parameters": {"binary_data_output": True}})
        binary = encode_infer_reply(reply, as_binary)
        assert b"".join(binary.binary) == data.tobytes()


@pytest.mark.parametrize(
    "data", [[[1.0], [[2.0]]], [[[1.0]], [2.0]], [[1.0, 2.0], []], [1.0, [2.0]], [[1.0], 2.0]]
)
def test_ragged_json_data_is_refused(data: list[Any]) -> None:
    with pytest.raises(InvalidArgument, match="Shape does not match true shape of 'data' field"):
        _decode(_one("FP32", [2, 1], data=data))


def test_rectangular_json_data_nested_or_flat_is_taken() -> None:
    for data in ([[1.0], [2.0]], [1.0, 2.0]):
        (spec,) = _decode(_one("FP32", [2, 1], data=data)).inputs
        assert spec.data is not None and spec.data.tolist() == [[1.0], [2.0]]


@pytest.mark.parametrize(
    ("text", "error"),
    [("1e999", "Number too big to be stored in double."), ("NaN", "Invalid value."),
     ("-Infinity", "Invalid value."), ("1e39", "does not fit FP32")],
)  # fmt: skip
def test_non_finite_json_input_is_refused(text: str, error: str) -> None:
    head = '{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [TEXT]}]}'
    body = head.replace("TEXT", text).encode()
    with pytest.raises(InvalidArgument, match=error.replace(".", r"\.")):
        decode_infer_request(body, None, "m", LIMITS)


# ------------------------------------------------------------------------------------------ fuzz

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_KEYS = st.sampled_from(["name", "datatype", "shape", "data", "parameters", "binary_data_size",
                         "shared_memory_region", "binary_data", "inputs", "outputs", "id"])  # fmt: skip
_DTYPES = st.sampled_from(["FP32", "INT8", "BF16", "BYTES", "BOOL", "UINT64", "FP16", "X"])


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """Near-valid requests with one or more fields replaced by garbage, and a binary tail of random size."""
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        item: dict[str, Any] = {
            "name": draw(st.text(max_size=4)),
            "datatype": draw(_DTYPES),
            "shape": draw(st.lists(st.integers(-2, 1 << 40), max_size=4)),
        }
        if draw(st.booleans()):
            item["parameters"] = {"binary_data_size": draw(st.integers(-5, 1 << 64))}
        else:
            item["data"] = draw(_JSON)
        if draw(st.booleans()):
            item[draw(_KEYS)] = draw(_JSON)
        inputs.append(item)
    head: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        head[draw(_KEYS)] = draw(_JSON)
    text = json.dumps(head).encode()
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.binary(max_size=8)) + text[cut:]
    tail = draw(st.binary(max_size=64))
    header = draw(st.one_of(st.none(), st.integers(0, len(text) + len(tail))))
    return text + tail, header


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_requests())
def test_fuzz_malformed_requests_decode_or_fail_cleanly(case: tuple[bytes, int | None]) -> None:
    body, header = case
    try:
        req = decode_infer_request(body, header, "m", LIMITS)
    except InvalidArgument as exc:
        assert str(exc)  # a text the client sees
        return
    for spec in req.inputs:  # what decodes is within the limits and consistent with its shape
        if spec.data is not None:
            assert spec.data.shape == spec.shape
            assert spec.data.dtype == object or spec.data.nbytes <= LIMITS.max_tensor_bytes


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.one_of(st.none(), st.text(max_size=24)))
def test_fuzz_random_bytes_and_header_values(body: bytes, header: str | None) -> None:
    try:
        length = parse_header_length(header, len(body))
        decode_infer_request(body, length, "m", LIMITS)
    except InvalidArgument:
        pass


def test_an_outputs_classification_count_is_taken() -> None:
    head = {"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": 3}}, {"name": "P"}]}
    assert [(o.name, o.class_count) for o in _decode(head).outputs] == [("O", 3), ("P", 0)]
