"""frontdoor/http_raw.py: a body cut into its inputs' byte ranges gives the bytes, and the errors, of the
kept header's decoding (``http_known``) for any body after the header; a reply is answered from a kept kind
only when its body and every frame's size are the kind's; an error reply raises as the usual reading does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client.errors import InvalidArgument, NotFound, Status
from zinfer.client.protocol import InferRequest, Reply, TensorRef
from zinfer.frontdoor.http_codec import Limits
from zinfer.frontdoor.http_known import KnownRequests
from zinfer.frontdoor.http_raw import RawPlan, RawReply, cut, kind_of, reply_kind

HEADER = json.dumps(
    {
        "inputs": [
            {"name": "A", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            {"name": "B", "shape": [1, 3], "datatype": "INT8", "parameters": {"binary_data_size": 3}},
        ],
        "outputs": [{"name": "SUM", "parameters": {"binary_data": True}}],
    }
).encode()
SUM = {"name": "SUM", "datatype": "FP32", "shape": [1, 2], "frame": 0}
BODY = {"model": "m", "version": 1, "outputs": [SUM]}


def _plan() -> RawPlan:
    inputs = (TensorRef("A", "FP32", (1, 2), None, 0), TensorRef("B", "INT8", (1, 3), None, 1))
    return RawPlan(("m", 0), object(), InferRequest("", "m", 1, inputs), (8, 3), 60.0)


def _cut(body: bytes) -> list[bytes] | str:
    try:
        return [bytes(f) for f in cut(_plan(), body, len(HEADER), "m")]
    except InvalidArgument as exc:
        return f"error: {exc}"


def _decoded(known: KnownRequests, body: bytes) -> list[bytes] | str:
    try:
        request = known.decode(body, len(HEADER), "m")
    except InvalidArgument as exc:
        return f"error: {exc}"
    return [bytes(i.data.tobytes()) for i in request.inputs if i.data is not None]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=20))
def test_cut_is_the_kept_decoding(tail: bytes) -> None:
    known = KnownRequests(Limits(max_tensor_bytes=1 << 20))
    known.decode(HEADER + bytes(11), len(HEADER), "m")  # the header kept
    assert known.header(HEADER + tail, len(HEADER)) is not None
    assert _cut(HEADER + tail) == _decoded(known, HEADER + tail)


def _reply(body: Any = BODY, status: Status = Status.OK, error: str = "") -> Reply:
    return Reply("1", status, error, body)


def test_a_reply_is_answered_from_its_kind_only_when_it_is_of_it() -> None:
    plan = _plan()
    frames = [memoryview(bytes(8))]
    assert kind_of(plan, _reply(), frames) is None  # no kind kept yet
    kind = reply_kind(_reply(), frames, (0,), b"{}", [memoryview(bytes(8))], b"HEAD")
    assert isinstance(kind, RawReply) and kind.parts == (0,) and kind.sizes == (8,)
    plan.reply = kind
    assert kind_of(plan, _reply(), [memoryview(bytes(range(8)))]) is kind
    assert kind_of(plan, _reply(), [memoryview(bytes(12))]) is None  # a frame of another size
    assert kind_of(plan, _reply(), [memoryview(bytes(8)), memoryview(b"")]) is None  # another frame
    other = {**BODY, "outputs": [{**SUM, "shape": [2, 1]}]}
    assert kind_of(plan, _reply(other), frames) is None
    traced = {**BODY, "parameters": {"zinfer_trace_id": "7"}}
    assert kind_of(plan, _reply(traced), frames) is None
    with pytest.raises(NotFound, match="no model"):
        kind_of(plan, _reply(None, Status.NOT_FOUND, "no model"), frames)


def test_no_kind_where_the_answer_is_not_the_frames() -> None:
    frames = [memoryview(bytes(8))]
    part = [memoryview(bytes(8))]
    assert reply_kind(_reply({**BODY, "parameters": {"p": 1}}), frames, (0,), b"{}", part, b"H") is None
    in_shm = {**BODY, "outputs": [{"name": "SUM", "datatype": "FP32", "shape": [1, 2], "shm": ["r", 0, 8]}]}
    assert reply_kind(_reply(in_shm), frames, (0,), b"{}", part, b"H") is None
    assert reply_kind(_reply(), frames, (0,), b"{}", [memoryview(bytes(4))], b"H") is None  # part of a frame
    assert reply_kind(_reply(), frames, (1,), b"{}", part, b"H") is None
