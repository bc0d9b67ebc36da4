"""The door's timestamps on the wire and in the tracer, and the SDK's choice of trace context."""

from __future__ import annotations

import sys

import pytest

from zinfer.broker.trace_settings import TraceSettings
from zinfer.broker.tracing import Tracer
from zinfer.client import protocol
from zinfer.client.errors import ProtocolError
from zinfer.client.protocol import TRACEPARENT, TraceSettingChange
from zinfer.client.trace_context import active_traceparent, with_trace_context


def test_stamps_round_trip_and_bad_ones_are_refused() -> None:
    change = TraceSettingChange(trace="ab" * 8, stamps=(("HTTP_RECV_START", 5), ("HTTP_SEND_END", 9)))
    assert protocol.trace_setting_from_wire(protocol.trace_setting_to_wire(change)) == change
    for bad in ([["X", -1]], [["X", True]], [["X"]], [[1, 2]], [["X", 1]] * 9, [["X" * 65, 1]]):
        with pytest.raises(ProtocolError):
            protocol.trace_setting_from_wire({"model": "", "trace": "t", "stamps": bad})


def test_door_stamps_need_a_known_token_and_keep_only_door_names() -> None:
    tracer = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1, file=""))
    t = tracer.start("m", 1, "r", {}, 1)
    assert t is not None
    assert not tracer.door_stamps(t.context[36:52], [("HTTP_RECV_START", 1)])  # not answered yet
    tracer.finish(t)
    added: list[object] = []
    tracer.output.extra = added.extend  # type: ignore[method-assign]
    token = t.context[36:52]
    assert not tracer.door_stamps("0" * 16, [("HTTP_RECV_START", 1)])  # a token never issued
    assert tracer.door_stamps(token, [("HTTP_RECV_START", 1), ("REQUEST_START", 2), ("HTTP_SEND_END", 3)])
    assert added == [{"id": t.id, "timestamps": [{"name": "HTTP_RECV_START", "ns": 1},
                                                 {"name": "HTTP_SEND_END", "ns": 3}]}]  # fmt: skip
    assert not tracer.door_stamps(token, [("HTTP_SEND_END", 4)])  # once only
    assert tracer._open == 0  # nothing left open


def test_sdk_trace_context_given_named_or_from_the_active_span() -> None:
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert with_trace_context(None, given) == {TRACEPARENT: given}
    assert with_trace_context({TRACEPARENT: "x"}, None) == {TRACEPARENT: "x"}
    otel_trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.sdk.trace import TracerProvider

    assert "opentelemetry.trace" in sys.modules
    assert active_traceparent() is None and with_trace_context(None, None) is None  # no active span
    with TracerProvider().get_tracer("t").start_as_current_span("caller") as span:
        ctx = span.get_span_context()
        want = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        assert with_trace_context({"a": 1}, None) == {"a": 1, TRACEPARENT: want}
        assert with_trace_context(None, given) == {TRACEPARENT: given}  # an explicit one wins
    assert otel_trace.get_current_span().get_span_context().is_valid is False
