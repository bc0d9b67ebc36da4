"""grpc_request: a ModelInferRequest read from its wire bytes answers exactly as the full path (protobuf's
parser and grpc_convert.infer_call) would, or leaves the request to it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from zinfer.client import dtypes
from zinfer.frontdoor import grpc_request
from zinfer.frontdoor.bridge_records import InferCall
from zinfer.frontdoor.door_client import wire_bytes
from zinfer.frontdoor.grpc_convert import infer_call


def _request(request_id: str = "", a: float = 1.0) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="add", model_version="2", id=request_id)
    r.inputs.add(name="A", datatype="FP32", shape=[2, 3])
    r.raw_input_contents.append(np.full((2, 3), a, np.float32).tobytes())
    r.inputs.add(name="T", datatype="BYTES", shape=[2])
    r.raw_input_contents.append(dtypes.serialize_bytes(np.array([b"x", b"yz"], dtype=object)))
    r.inputs.add(name="E", datatype="INT64", shape=[0, 4])
    r.raw_input_contents.append(b"")
    r.outputs.add(name="OUT")
    return r


def _same(fast: InferCall, full: InferCall) -> None:
    assert fast._replace(inputs=()) == full._replace(inputs=())
    assert len(fast.inputs) == len(full.inputs)
    for a, b in zip(fast.inputs, full.inputs, strict=True):
        assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert a.data.tolist() == b.data.tolist()
        if a.datatype == dtypes.BYTES:
            assert wire_bytes(a.data) == wire_bytes(b.data)


def _full(payload: bytes) -> InferCall:
    return infer_call(service_pb2.ModelInferRequest.FromString(payload), None)


def test_a_header_seen_before_is_read_from_the_bytes_as_the_full_path_reads_it() -> None:
    known: grpc_request.Headers = {}
    first = _request().SerializeToString()
    assert grpc_request.read(first, known) is None  # first sight: the full path's
    for request_id, a in (("", 2.0), ("req-7", 3.0), ("é-8", -1.5)):
        payload = _request(request_id, a).SerializeToString()
        fast = grpc_request.read(payload, known)
        assert fast is not None, request_id
        _same(fast, _full(payload))
        assert fast.request_id == request_id and fast.inputs[0].data[1, 2] == a
    assert len(known) == 1  # the id is not part of the header


def test_request_parameters_are_read_once_per_header_as_the_full_path_reads_them() -> None:
    known: grpc_request.Headers = {}
    for i in range(3):
        r = _request(f"r{i}", float(i))
        r.parameters["triton_enable_empty_final_response"].bool_param = True  # perf_analyzer sends it
        r.parameters["sequence_id"].string_param = "s-1"
        r.parameters["sequence_start"].bool_param = True
        r.parameters["priority"].int64_param = 2
        r.parameters["timeout"].int64_param = 500
        payload = r.SerializeToString()
        fast = grpc_request.read(payload, known)
        if i == 0:
            assert fast is None
            continue
        assert fast is not None
        _same(fast, _full(payload))
        assert (fast.priority, fast.timeout_us, fast.sequence_id) == (2, 500, "s-1") and fast.sequence_start
        with pytest.raises(TypeError):
            fast.parameters["priority"] = 3  # type: ignore[index]  # shared by the header's calls: read only


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.parameters["sequence_id"].__setattr__("double_param", 1.5),
        lambda r: r.parameters["priority"].__setattr__("string_param", "high"),
        lambda r: r.parameters["sequence_start"].__setattr__("int64_param", 1),
        lambda r: r.inputs[0].parameters["shared_memory_region"].__setattr__("string_param", "x"),
        lambda r: r.outputs[0].parameters["classification"].__setattr__("int64_param", 2),
        lambda r: r.outputs[0].parameters["shared_memory_region"].__setattr__("string_param", "x"),
        lambda r: r.inputs.add(name="A", datatype="FP32", shape=[1]),
        lambda r: r.inputs.add(name="Z", datatype="NOPE", shape=[1]),
        lambda r: r.inputs.add(name="Z", datatype="FP32", shape=[-1]),
        lambda r: r.__setattr__("model_name", ""),
    ],
)
def test_requests_needing_more_than_their_raw_contents_always_go_the_full_path(change: Any) -> None:
    known: grpc_request.Headers = {}
    r = _request()
    change(r)
    payload = r.SerializeToString()
    assert grpc_request.read(payload, known) is None
    assert grpc_request.read(payload, known) is None


def test_contents_instead_of_raw_bytes_go_the_full_path() -> None:
    known: grpc_request.Headers = {}
    r = service_pb2.ModelInferRequest(model_name="add")
    r.inputs.add(name="A", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    payload = r.SerializeToString()
    assert grpc_request.read(payload, known) is None and grpc_request.read(payload, known) is None


def _seen(payload: bytes) -> grpc_request.Headers:
    known: grpc_request.Headers = {}
    grpc_request.read(_request().SerializeToString(), known)
    return known


@pytest.mark.parametrize(
    "payload",
    [
        _request().SerializeToString() + b"\x3a\x01\x00",  # a raw contents too many
        _request().SerializeToString()[:-1],  # cut short
        _request("a").SerializeToString() + b"\x1a\x01b",  # the id twice (protobuf: the last wins)
        b"\x1a\x02\xff\xfe" + _request().SerializeToString(),  # an id that is not UTF-8, out of order
        _request().SerializeToString() + b"\x0a\x03add",  # a field after the raw contents
        _request().SerializeToString() + b"\x40\x01",  # an unknown field
        b"\x0a\x83\x80\x80\x80\x80\x00add" + _request().SerializeToString()[5:],  # an overlong length
    ],
)
def test_bytes_protobuf_would_not_write_go_the_full_path(payload: bytes) -> None:
    assert grpc_request.read(payload, _seen(payload)) is None


def test_a_raw_contents_of_the_wrong_size_goes_the_full_path_which_says_so() -> None:
    r = _request()
    r.raw_input_contents[0] = b"\0" * 20
    payload = r.SerializeToString()
    known = _seen(payload)
    assert grpc_request.read(payload, known) is None
    with pytest.raises(Exception, match="Expected 24, got 20"):
        _full(payload)


def test_malformed_bytes_items_go_the_full_path() -> None:
    r = _request()
    r.raw_input_contents[1] = b"\xff\xff\xff\xff"
    payload = r.SerializeToString()
    assert grpc_request.read(payload, _seen(payload)) is None


def test_the_table_of_headers_stays_bounded() -> None:
    known: grpc_request.Headers = {}
    for i in range(grpc_request.MAX_HEADERS * 2 + 5):
        r = service_pb2.ModelInferRequest(model_name=f"m{i}")
        grpc_request.read(r.SerializeToString(), known)
        assert len(known) <= grpc_request.MAX_HEADERS
    big = service_pb2.ModelInferRequest(model_name="m" * (grpc_request.MAX_HEADER + 1)).SerializeToString()
    before = dict(known)
    assert grpc_request.read(big, known) is None and known == before  # not kept


def _mutated(rng: random.Random, base: bytes, edits: tuple[int, ...]) -> bytes:
    """``base`` with a few random byte edits (their count drawn from ``edits``): each a changed, dropped or
    inserted byte."""
    payload = bytearray(base)
    for _ in range(rng.choice(edits)):
        at = rng.randrange(len(payload))
        kind = rng.random()
        if kind < 0.5:
            payload[at] = rng.randrange(256)
        elif kind < 0.75:
            del payload[at]
        else:
            payload.insert(at, rng.randrange(256))
    return bytes(payload)


def test_mutated_requests_are_read_as_the_full_path_reads_them_or_left_to_it() -> None:
    """Random changes to a request's bytes: whatever the fast path answers, the full path answers alike."""
    rng = random.Random(33)
    r = _request("id-1")
    r.parameters["triton_enable_empty_final_response"].bool_param = True
    r.parameters["sequence_id"].int64_param = 9
    base = r.SerializeToString()
    answered = 0
    for _ in range(3000):
        data = _mutated(rng, base, (1, 1, 2, 3))
        known: grpc_request.Headers = {}
        grpc_request.read(data, known)  # first sight
        fast = grpc_request.read(data, known)
        if fast is None:
            continue
        answered += 1
        _same(fast, _full(data))  # the full path parses it and gives the same call
    assert answered > 100  # changes inside the tensors' bytes and the id are read fast


def test_a_request_after_the_same_header_is_read_without_walking_it_as_the_walk_reads_it() -> None:
    known: grpc_request.Headers = {}
    recent: grpc_request.Last = []
    first = _request().SerializeToString()
    assert grpc_request.read(first, known, recent) is None and recent == []  # first sight: the full path's
    assert grpc_request.read(first, known, recent) is not None
    header = recent[0]
    assert first.startswith(header) and first[len(header)] == 0x3A  # the header: up to the raw contents
    for request_id, a in (("", 2.0), ("req-7", 3.0), ("", -1.5)):
        payload = _request(request_id, a).SerializeToString()
        fast = grpc_request.read(payload, known, recent)
        assert fast is not None
        _same(fast, _full(payload))
        assert fast.request_id == request_id and fast.inputs[0].data[1, 2] == a
        assert recent[0] == header  # a request with an id is not a header to start with


@pytest.mark.parametrize(
    "tail",
    [
        b"\x40\x01",  # an unknown field after the raw contents
        b"\x0a\x03add",  # a header field after them
        b"\x3a\x00",  # one raw contents too many
        b"\x3a\x05ab",  # a length past the end
    ],
)
def test_anything_but_raw_contents_after_the_recent_header_goes_the_walk_and_the_full_path(
    tail: bytes,
) -> None:
    known: grpc_request.Headers = {}
    recent: grpc_request.Last = []
    payload = _request().SerializeToString()
    grpc_request.read(payload, known, recent)
    assert grpc_request.read(payload, known, recent) is not None and recent
    assert grpc_request.read(payload + tail, known, recent) is None
    assert grpc_request.read(payload + tail, known) is None  # the walk says the same


def test_mutated_requests_after_a_recent_header_are_read_as_the_walk_reads_them() -> None:
    """Random changes to a request whose unchanged header was read last: the short read answers exactly
    as the walk (and so the full path) does."""
    rng = random.Random(34)
    r = _request()
    r.parameters["triton_enable_empty_final_response"].bool_param = True
    base = r.SerializeToString()
    known: grpc_request.Headers = {}
    recent: grpc_request.Last = []
    grpc_request.read(base, known, recent)
    grpc_request.read(base, known, recent)
    header = recent[0]
    answered = 0
    for _ in range(3000):
        data = _mutated(rng, base, (1, 1, 2))
        cell = [header, recent[1]]
        short = grpc_request.read(data, dict(known), cell)
        walked = grpc_request.read(data, dict(known))
        assert (short is None) == (walked is None)
        if short is not None and walked is not None:
            answered += 1
            _same(short, walked)
            _same(short, _full(data))
    assert answered > 100
