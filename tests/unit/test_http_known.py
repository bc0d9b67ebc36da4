"""frontdoor/http_known.py: a request whose JSON header was seen before decodes to what a full decode gives,
with the same errors; a reply of a kind seen before is the bytes a full encoding writes, head included; the
tables stay bounded whatever a client sends."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor import http_known
from zinfer.frontdoor.bridge_records import InferReply, Tensor
from zinfer.frontdoor.http_codec import HEADER_LENGTH, HttpInferRequest, Limits, decode_infer_request
from zinfer.frontdoor.http_known import KnownReplies, KnownRequests
from zinfer.frontdoor.http_reply import encode_infer_reply
from zinfer.frontdoor.http_wire import HttpResponse

LIMITS = Limits(max_tensor_bytes=1 << 20, max_json_bytes=1 << 20)

ADD = {
    "inputs": [
        {"name": "A", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "B", "shape": [1, 2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
    ],
    "outputs": [{"name": "SUM", "parameters": {"binary_data": True}}],
}


def _full(body: bytes, header: int | None) -> HttpInferRequest | str:
    try:
        return decode_infer_request(body, header, "m", LIMITS)
    except InvalidArgument as exc:
        return f"error: {exc}"


def _known(known: KnownRequests, body: bytes, header: int | None) -> HttpInferRequest | str:
    try:
        return known.decode(body, header, "m")
    except InvalidArgument as exc:
        return f"error: {exc}"


def _same(a: HttpInferRequest | str, b: HttpInferRequest | str) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert a._replace(inputs=()) == b._replace(inputs=())
    assert len(a.inputs) == len(b.inputs)
    for x, y in zip(a.inputs, b.inputs, strict=True):
        assert x[:3] == y[:3] and x.shm == y.shm
        assert (x.data is None) == (y.data is None)
        if x.data is not None and y.data is not None:
            assert x.data.dtype == y.data.dtype and x.data.shape == y.data.shape
            if x.data.dtype == object:
                assert x.data.tolist() == y.data.tolist()
            else:
                assert x.data.tobytes() == y.data.tobytes()


def test_a_header_seen_before_takes_the_new_bodys_bytes() -> None:
    known = KnownRequests(LIMITS)
    head = json.dumps(ADD).encode()
    first = head + np.array([1, 2], np.float32).tobytes() + np.array([3, 4], np.int32).tobytes()
    second = head + np.array([5, 6], np.float32).tobytes() + np.array([7, 8], np.int32).tobytes()
    _same(known.decode(first, len(head), "m"), _full(first, len(head)))
    assert len(known._known) == 1  # kept
    got = known.decode(second, len(head), "m")
    _same(got, _full(second, len(head)))
    assert got.inputs[0].data is not None and got.inputs[0].data.tolist() == [[5.0, 6.0]]
    assert got.inputs[1].data is not None and got.inputs[1].data.tolist() == [[7, 8]]


@pytest.mark.parametrize(
    "tail, error",
    [
        (b"\x00" * 12, "unexpected size for input 'B', expecting 4 additional bytes for model 'm'"),
        (b"\x00" * 4, "unexpected size for input 'A', expecting 4 additional bytes for model 'm'"),
        (b"\x00" * 17, "unexpected additional input data for model 'm'"),
    ],
)
def test_a_known_header_with_a_wrong_binary_part_is_refused_as_before(tail: bytes, error: str) -> None:
    known = KnownRequests(LIMITS)
    head = json.dumps(ADD).encode()
    known.decode(head + b"\x00" * 16, len(head), "m")
    assert _known(known, head + tail, len(head)) == _full(head + tail, len(head)) == f"error: {error}"


@pytest.mark.parametrize(
    "head, tail",
    [
        ({**ADD, "id": "r1"}, b"\x00" * 16),  # an id changes call after call
        ({"inputs": [{"name": "A", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}, b""),  # JSON data
        ({"inputs": [{"name": "T", "shape": [1], "datatype": "BYTES",
                      "parameters": {"binary_data_size": 5}}]}, struct.pack("<I", 1) + b"x"),
        ({"inputs": [{"name": "S", "shape": [2], "datatype": "INT32", "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 8}}]}, b""),
    ],
)  # fmt: skip
def test_what_changes_per_request_is_not_kept(head: dict[str, Any], tail: bytes) -> None:
    known = KnownRequests(LIMITS)
    text = json.dumps(head).encode()
    body = text + tail
    _same(known.decode(body, len(text), "m"), _full(body, len(text)))
    assert not known._known


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_known, "MAX_KINDS", 4)
    known = KnownRequests(LIMITS)
    for n in range(10):
        head = json.dumps({**ADD, "parameters": {"k": n}}).encode()
        known.decode(head + b"\x00" * 16, len(head), "m")
        assert len(known._known) <= 4
    big = json.dumps({**ADD, "parameters": {"k": "x" * http_known.KEY_BYTES}}).encode()
    known.decode(big + b"\x00" * 16, len(big), "m")
    assert all(len(k) <= http_known.KEY_BYTES for k in known._known)


_NAMES = st.sampled_from(["A", "B", "ä"])
_TYPES = st.sampled_from(["FP32", "INT8", "BOOL", "BYTES", "FP16", "INT64"])


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[dict[str, Any], list[bytes]]:
    """A header (near valid: sizes off, names repeated, JSON data or binary) and tails to send it with."""
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        item: dict[str, Any] = {"name": draw(_NAMES), "datatype": draw(_TYPES), "shape": shape}
        if draw(st.booleans()):
            item["parameters"] = {"binary_data_size": draw(st.integers(0, 40))}
        else:
            item["data"] = draw(st.lists(st.integers(0, 1), max_size=4))
        inputs.append(item)
    head: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        head["parameters"] = {"priority": draw(st.integers(0, 2)), "x": 1}
    if draw(st.booleans()):
        head["outputs"] = [{"name": "O", "parameters": {"binary_data": draw(st.booleans())}}]
    tails = draw(st.lists(st.binary(max_size=48), min_size=1, max_size=4))
    return head, tails


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies())
def test_fuzz_a_known_header_decodes_as_a_full_decode(case: tuple[dict[str, Any], list[bytes]]) -> None:
    head, tails = case
    text = json.dumps(head).encode()
    known = KnownRequests(LIMITS)
    for tail in [tails[0], *tails]:  # the first twice: the second time from the kept header
        _same(_known(known, text + tail, len(text)), _full(text + tail, len(text)))


# ------------------------------------------------------------------------------------------ replies


def _reply(a: np.ndarray[Any, Any], rid: str = "") -> InferReply:
    return InferReply("add", "1", rid, (Tensor("SUM", "FP32", tuple(a.shape), a), Tensor("X", "INT8", (1,),
                      np.zeros(1, np.int8))))  # fmt: skip


def _written(known: KnownReplies, reply: InferReply, request: HttpInferRequest) -> bytes:
    """The answer the server writes for ``reply`` on a keep-alive connection."""
    (text, parts), head = known.encode(reply, request, frozenset())
    if parts:
        headers = {HEADER_LENGTH: str(len(text))}
        answer = HttpResponse(200, (text, *parts), "application/octet-stream", headers)
    else:
        answer = HttpResponse(200, (text,), "application/json")
    written = answer.head(True) if head is None else head
    assert written == answer.head(True)  # written ahead: what the head would have been
    return written + b"".join(bytes(p) for p in (text, *parts))


def _full_answer(reply: InferReply, request: HttpInferRequest) -> bytes:
    return _written(KnownReplies(), reply, request)


@pytest.mark.parametrize(
    "outputs, binary_output",
    [
        ([{"name": "SUM", "parameters": {"binary_data": True}}], False),
        ([], True),  # every output, as binary data
        ([{"name": "SUM"}], False),  # JSON data: not kept
        ([{"name": "X", "parameters": {"binary_data": True}}, {"name": "SUM"}], False),
    ],
)
def test_a_known_kind_of_reply_writes_what_a_full_encoding_writes(
    outputs: list[dict[str, Any]], binary_output: bool
) -> None:
    head: dict[str, Any] = {"inputs": [], "outputs": outputs}
    head["parameters"] = {"binary_data_output": binary_output}
    request = decode_infer_request(json.dumps(head).encode(), None, "m", LIMITS)
    known = KnownReplies()
    for n in range(3):
        reply = _reply(np.full((1, 2), n, np.float32))
        assert _written(known, reply, request) == _full_answer(reply, request)
        assert json.loads(encode_infer_reply(reply, request).json)  # the JSON itself still parses
    # another shape, an id, then the first kind again
    for reply in (_reply(np.ones((2, 2), np.float32)), _reply(np.ones((1, 2), np.float32), "q"),
                  _reply(np.full((1, 2), 7, np.float32))):  # fmt: skip
        assert _written(known, reply, request) == _full_answer(reply, request)


def test_a_reply_whose_bytes_do_not_match_its_kind_is_written_in_full() -> None:
    request = decode_infer_request(json.dumps({"inputs": [], "parameters": {"binary_data_output": True}})
                                   .encode(), None, "m", LIMITS)  # fmt: skip
    known = KnownReplies()
    ok = _reply(np.ones((1, 2), np.float32))
    _written(known, ok, request)
    odd = ok._replace(outputs=(Tensor("SUM", "FP32", (1, 2), np.ones((1, 2), np.float64)), ok.outputs[1]))
    (_, parts), head = known.encode(odd, request, frozenset())
    assert head is None and sum(p.nbytes for p in parts) == 17  # the array's own bytes, with a fresh head


# ------------------------------------------------------------------------------------------ targets


@pytest.mark.parametrize(
    "target, found",
    [
        ("/v2/models/add/infer", ("add", "")),
        ("/v2/models/add/versions/3/infer?x=1", ("add", "3")),
        ("/v2/models/a%2Fb/infer", ("a/b", "")),
        ("/v2/models/add/ready", None),
        ("/v2/models/add/versions/x/infer", None),
        ("/v2/models/add/infer/more", None),
        ("/v2/health/ready", None),
    ],
)
def test_infer_targets_as_the_route_reads_them(target: str, found: tuple[str, str] | None) -> None:
    targets = http_known.InferTargets()
    assert targets.get(target) == found
    assert targets.get(target) == found  # kept


def test_the_targets_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_known, "MAX_KINDS", 4)
    targets = http_known.InferTargets()
    for n in range(10):
        assert targets.get(f"/v2/models/m{n}/infer") == (f"m{n}", "")
        assert len(targets._known) <= 4
    long = "/v2/models/" + "m" * http_known.KEY_BYTES + "/infer"
    assert targets.get(long) == ("m" * http_known.KEY_BYTES, "")
    assert long not in targets._known
