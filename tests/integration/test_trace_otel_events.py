"""OpenTelemetry mode, the rest of Triton's trace: level TENSORS as span events, the door's timestamps as a
span of its own, and the zmq SDK continuing the caller's active span; exported to a real OTLP/HTTP
receiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, start_server, stop_all, wait_for
from tests.frontdoor_helpers import free_port, repository, wait_http
from tests.integration.test_tracing_otel import Receiver
from zinfer.client import Client

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")

pytestmark = pytest.mark.integration


@pytest.fixture
def otel_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, Receiver]]:
    receiver = Receiver()
    http_url = f"127.0.0.1:{free_port()}"
    flags = ("mode=opentelemetry", f"opentelemetry,url={receiver.url}", "level=TIMESTAMPS", "level=TENSORS",
             "rate=1", "opentelemetry,bsp_schedule_delay=50")  # fmt: skip
    server = start_server(repository(tmp_path, ("add",)), "--http", http_url,
                          *[a for f in flags for a in ("--trace-config", f)])  # fmt: skip
    try:
        wait_http(http_url)
        yield server, http_url, receiver
    finally:
        stop_all([server])
        receiver.close()


def _attrs(span: Any) -> dict[str, Any]:
    return {a.key: a.value for a in span.attributes}


def _request(receiver: Receiver, rid: str) -> Any:
    spans = [s for _, s in receiver.named("InferRequest") if _attrs(s)["request_id"].string_value == rid]
    assert len(spans) == 1, rid
    return spans[0]


def test_tensors_door_span_and_the_sdk_active_span(otel_server: tuple[ServerProcess, str, Receiver]) -> None:
    server, http_url, receiver = otel_server
    a, b = np.full((1, 1), 2, np.float32), np.full((1, 1), 5, np.float32)
    caller_tracer = sdk_trace.TracerProvider().get_tracer("test")  # spans kept in this process only
    with Client(server.url, timeout=30) as c:
        with caller_tracer.start_as_current_span("caller") as caller:
            c.infer("add", {"INPUT_A": a, "INPUT_B": b}, request_id="in-span")  # no trace_context given
        c.infer("add", {"INPUT_A": a, "INPUT_B": b}, request_id="no-span")
    h = httpclient.InferenceServerClient(http_url, network_timeout=30.0)
    try:
        inputs = []
        for name, value in (("INPUT_A", a), ("INPUT_B", b)):
            i = httpclient.InferInput(name, [1, 1], "FP32")
            i.set_data_from_numpy(value)
            inputs.append(i)
        h.infer("add", inputs, request_id="via-http")
        h.infer("add", inputs, request_id="later")  # gives via-http's door stamps time to arrive
    finally:
        h.close()
    wait_for(lambda: len(receiver.named("HTTP")) >= 1 and len(receiver.named("InferRequest")) >= 4, 30,
             "the spans at the receiver")  # fmt: skip

    ctx = caller.get_span_context()
    in_span = _request(receiver, "in-span")
    assert in_span.trace_id == ctx.trace_id.to_bytes(16, "big")  # the SDK continued the active span
    assert in_span.parent_span_id == ctx.span_id.to_bytes(8, "big")
    no_span = _request(receiver, "no-span")
    assert no_span.trace_id != in_span.trace_id and not no_span.parent_span_id

    events = {e.name: e for e in in_span.events}  # level TENSORS: Triton's tensor entries as events
    queued = [e for e in in_span.events if e.name == "TENSOR_QUEUE_INPUT"]
    got = {_attrs(e)["name"].string_value: _attrs(e)["data"].string_value for e in queued}
    assert got == {"INPUT_A": "2", "INPUT_B": "5"}
    outputs = [e for e in in_span.events if e.name == "TENSOR_BACKEND_OUTPUT"]
    by_name = {_attrs(e)["name"].string_value: _attrs(e) for e in outputs}
    out = by_name["OUTPUT_SUM"]
    assert out["data"].string_value == "7" and out["dtype"].string_value == "FP32"
    assert out["shape"].string_value == "1,1"
    assert events["TENSOR_QUEUE_INPUT"].time_unix_nano == events["QUEUE_START"].time_unix_nano

    via_http = _request(receiver, "via-http")
    doors = [s for _, s in receiver.named("HTTP") if s.parent_span_id == via_http.span_id]
    assert len(doors) == 1 and doors[0].trace_id == via_http.trace_id
    names = [e.name for e in doors[0].events]
    assert names == ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert doors[0].start_time_unix_nano <= via_http.start_time_unix_nano
    # one clock in both processes (moved onto the wall clock by one offset): the door span holds the request's
    assert via_http.end_time_unix_nano <= doors[0].end_time_unix_nano
