"""OpenTelemetry mode: a real ``zinfer serve`` exports its traces over OTLP/HTTP to a receiver in this test,
which decodes them with opentelemetry-proto."""

from __future__ import annotations

import gzip
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from zinfer.client import Client

trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)
TRACE_ID, SPAN_ID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"


class Receiver:
    """An OTLP/HTTP trace receiver: every span it is sent, with its resource attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service.ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for rs in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            receiver.spans.extend((resource, s) for s in ss.spans)
                reply = trace_service.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def named(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        with self.lock:
            return [(r, s) for r, s in self.spans if s.name == name]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_spans_reach_an_otlp_receiver(
    server_factory: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    flags = ("mode=opentelemetry", f"opentelemetry,url={receiver.url}", "level=TIMESTAMPS", "rate=1",
             "count=2", "opentelemetry,bsp_schedule_delay=50",
             "opentelemetry,resource=deployment=test")  # fmt: skip
    server = server_factory(MODELS, *[a for f in flags for a in ("--trace-config", f)])
    with Client(server.url, timeout=30) as c:
        assert c.get_trace_settings()["trace_mode"] == "opentelemetry"
        parent = f"00-{TRACE_ID}-{SPAN_ID}-01"
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="ctx", trace_context=parent)
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="fresh")
        c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="past-count")
        wait_for(lambda: len(receiver.named("compute")) >= 2, 30, "the spans at the receiver")
    requests = receiver.named("InferRequest")
    computes = receiver.named("compute")
    assert len(requests) == 2 and len(computes) == 2  # count=2
    by_rid: dict[str, Any] = {}
    for resource, span in requests:
        assert resource["service.name"] == "zinfer" and resource["deployment"] == "test"
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["model_name"].string_value == "add" and attrs["model_version"].int_value == 1
        assert attrs["zinfer.batch_size"].int_value >= 1
        assert [e.name for e in span.events][:2] == ["REQUEST_START", "QUEUE_START"]
        assert span.start_time_unix_nano <= span.end_time_unix_nano
        by_rid[attrs["request_id"].string_value] = span
    assert sorted(by_rid) == ["ctx", "fresh"]
    ctx, fresh = by_rid["ctx"], by_rid["fresh"]
    assert ctx.trace_id.hex() == TRACE_ID and ctx.parent_span_id.hex() == SPAN_ID  # the caller's trace
    assert fresh.trace_id.hex() != TRACE_ID and not fresh.parent_span_id  # a root of its own
    for request_span in (ctx, fresh):  # each request's compute span is its child, inside it in time
        (compute,) = [s for _, s in computes if s.parent_span_id == request_span.span_id]
        assert compute.trace_id == request_span.trace_id
        assert request_span.start_time_unix_nano <= compute.start_time_unix_nano
        assert compute.end_time_unix_nano <= request_span.end_time_unix_nano
        names = [e.name for e in compute.events]
        assert names == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


def test_bad_otel_settings_stop_the_start(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(MODELS, "--trace-config", "mode=opentelemetry", "--trace-config",
                            "opentelemetry,bsp_max_queue_size=lots", wait_ready=False)  # fmt: skip
    wait_for(lambda: server.proc.poll() is not None, 30, "the server to refuse its flags")
    assert server.proc.returncode != 0 and "bsp_max_queue_size" in server.log()


def test_ensemble_step_spans_are_children(
    server_factory: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    flags = ("mode=opentelemetry", f"opentelemetry,url={receiver.url}", "level=TIMESTAMPS", "rate=1",
             "opentelemetry,bsp_schedule_delay=50")  # fmt: skip
    server = server_factory(MODELS, *[a for f in flags for a in ("--trace-config", f)])
    with Client(server.url, timeout=30) as c:
        c.infer("text_pipeline", {"TEXT": np.array([[b"abc"]], dtype=object)}, request_id="ens",
                trace_context=f"00-{TRACE_ID}-{SPAN_ID}-01")  # fmt: skip
        wait_for(lambda: len(receiver.named("InferRequest")) >= 4, 30, "the ensemble's spans")
    spans = [s for _, s in receiver.named("InferRequest")]
    models = {s.span_id: {a.key: a.value for a in s.attributes}["model_name"].string_value for s in spans}
    (top,) = [s for s in spans if models[s.span_id] == "text_pipeline"]
    assert top.trace_id.hex() == TRACE_ID and top.parent_span_id.hex() == SPAN_ID
    steps = [s for s in spans if s is not top]
    assert sorted(models[s.span_id] for s in steps) == ["detokenizer", "rot13", "tokenizer"]
    assert all(s.parent_span_id == top.span_id and s.trace_id == top.trace_id for s in steps)


def test_bls_call_span_is_a_child(
    server_factory: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    for name in ("bls_router", "identity", "double"):
        shutil.copytree(MODELS / name, repo / name)
    code = repo / "bls_router" / "1" / "model.py"
    call = "pb_utils.InferenceRequest("
    traced = code.read_text().replace(call, call + "trace=request.trace(),")
    code.write_text(traced)
    flags = ("mode=opentelemetry", f"opentelemetry,url={receiver.url}", "level=TIMESTAMPS", "rate=1",
             "opentelemetry,bsp_schedule_delay=50")  # fmt: skip
    server = server_factory(repo, *[a for f in flags for a in ("--trace-config", f)])
    with Client(server.url, timeout=30) as c:
        c.infer("bls_router", {"X": np.ones(2, np.float32)}, trace_context=f"00-{TRACE_ID}-{SPAN_ID}-01")
        wait_for(lambda: len(receiver.named("InferRequest")) >= 2, 30, "the caller's and the call's spans")
    spans = [s for _, s in receiver.named("InferRequest")]
    models = {s.span_id: {a.key: a.value for a in s.attributes}["model_name"].string_value for s in spans}
    (caller,) = [s for s in spans if models[s.span_id] == "bls_router"]
    (call,) = [s for s in spans if models[s.span_id] == "identity"]
    assert caller.trace_id.hex() == TRACE_ID and caller.parent_span_id.hex() == SPAN_ID
    assert call.trace_id == caller.trace_id and call.parent_span_id == caller.span_id
