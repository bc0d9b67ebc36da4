"""OpenTelemetry mode: each trace as spans, exported over OTLP/HTTP (the optional extra ``zinfer[tracing]``).

``--trace-config mode=opentelemetry`` with ``opentelemetry,url=`` (default Triton's,
``http://localhost:4318/v1/traces``), ``opentelemetry,resource=KEY=VALUE`` (repeatable; ``service.name``
defaults to ``zinfer``) and the batch span processor's ``bsp_max_queue_size``, ``bsp_schedule_delay``
(milliseconds) and ``bsp_max_export_batch_size``. Spans are handed to the SDK's batch span processor, which
exports them from its own thread: the broker loop never waits on the collector.

Each trace is a span ``InferRequest`` (REQUEST_START to REQUEST_END; Triton's timestamps as its events,
zinfer's batch, worker and wire figures as attributes) with a child span ``compute`` (COMPUTE_START to
COMPUTE_END, the input end and output start as events). An ensemble's steps are ``InferRequest`` spans
under the ensemble's (begun when its first step is traced, ended when it answers). A request that carried
a W3C ``traceparent`` becomes a child of the caller's span. The broker's monotonic times are moved onto the
wall clock (which OpenTelemetry wants) by one offset read when tracing starts.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_URL = "http://localhost:4318/v1/traces"
_INTS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
# when each level-TENSORS entry is an event: inputs as the request queues and as compute starts, outputs
# as the model's output phase starts (or, a request that ran no batch of its own, when it ends)
_TENSOR_AT = {"TENSOR_QUEUE_INPUT": "QUEUE_START", "TENSOR_BACKEND_INPUT": "COMPUTE_START",
              "TENSOR_BACKEND_OUTPUT": "COMPUTE_OUTPUT_START"}  # fmt: skip


def missing() -> str | None:
    """Why OpenTelemetry mode cannot run here, or None when it can."""
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return "--trace-config mode=opentelemetry: pip install 'zinfer[tracing]' (the OpenTelemetry SDK)"
    return None


def check(settings: Sequence[tuple[str, str]]) -> None:
    """A ``ValueError`` for a bad OpenTelemetry setting (numbers, ``resource`` as KEY=VALUE)."""
    for name, value in settings:
        if name in _INTS:
            try:
                n = int(value)
            except ValueError:
                text = f"trace setting opentelemetry,{name}: expected an integer, got {value!r}"
                raise ValueError(text) from None
            if n < (0 if name == "bsp_schedule_delay" else 1):
                raise ValueError(f"trace setting opentelemetry,{name}: out of range: {n}")
        elif name == "resource" and "=" not in value:
            raise ValueError(f"trace setting opentelemetry,resource: expected KEY=VALUE, got {value!r}")
        elif name == "url" and not value.startswith(("http://", "https://")):
            raise ValueError(f"trace setting opentelemetry,url: expected an http(s) URL, got {value!r}")


class OtelOutput:
    def __init__(self, settings: Sequence[tuple[str, str]]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        check(settings)
        url = DEFAULT_URL
        attributes: dict[str, str] = {"service.name": "zinfer"}
        bsp: dict[str, int] = {}
        for name, value in settings:
            if name == "url":
                url = value
            elif name == "resource":
                key, _, val = value.partition("=")
                attributes[key.strip()] = val.strip()
            else:
                bsp[name] = int(value)
        self.provider = TracerProvider(resource=Resource.create(attributes))
        processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=url),
            max_queue_size=bsp.get("bsp_max_queue_size"),
            schedule_delay_millis=bsp.get("bsp_schedule_delay"),
            max_export_batch_size=bsp.get("bsp_max_export_batch_size"),
        )
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("zinfer")
        self.offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock

    def begin(
        self,
        model: str,
        version: int,
        request_id: str,
        parent: tuple[str, str] | None,
        start_ns: int,
        parent_span: Any,
    ) -> Any:
        """A request's ``InferRequest`` span, begun at ``start_ns`` (monotonic): a child of ``parent_span``
        (an ensemble's), else of the caller's span named by ``parent`` (W3C ids), else a root."""
        from opentelemetry import trace

        context = None
        if parent_span is not None:
            context = trace.set_span_in_context(parent_span)
        elif parent is not None:
            remote = trace.SpanContext(
                int(parent[0], 16), int(parent[1], 16), is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )  # fmt: skip
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        attributes: dict[str, str | int] = {"model_name": model, "model_version": version}
        attributes["request_id"] = request_id
        return self.tracer.start_span(
            "InferRequest", context=context, start_time=start_ns + self.offset_ns, attributes=attributes
        )

    def record(
        self,
        model: str,
        version: int,
        request_id: str,
        parent: tuple[str, str] | None,
        stamps: Sequence[tuple[str, int]],
        own: dict[str, Any],
        parent_span: Any = None,
        span: Any = None,
        tensors: Sequence[dict[str, Any]] = (),
    ) -> Any:
        """A request's span, ended (begun here if ``span`` is None): its timestamps as events, a ``compute``
        child where it ran on an instance, level TENSORS' entries as events ``TENSOR_*`` (attributes name,
        data, shape, dtype) at the time each applies. Returns the span."""
        from opentelemetry import trace

        at = dict(stamps)
        o = self.offset_ns
        if span is None:
            span = self.begin(model, version, request_id, parent, at["REQUEST_START"], parent_span)
        if "COMPUTE_START" in at:
            compute = self.tracer.start_span(
                "compute", context=trace.set_span_in_context(span), start_time=at["COMPUTE_START"] + o,
                attributes={"model_name": model, "model_version": version},
            )  # fmt: skip
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"):
                compute.add_event(name, timestamp=at[name] + o)
            compute.end(end_time=at["COMPUTE_END"] + o)
        span.set_attributes({f"zinfer.{k}": v for k, v in own.items() if isinstance(v, str | int)})
        for name, ns in stamps:
            span.add_event(name, timestamp=ns + o)
        for e in tensors:
            when = at.get(_TENSOR_AT.get(str(e.get("activity")), ""), at["REQUEST_END"])
            attrs = {k: v for k, v in e["tensor"].items() if isinstance(v, str | int | bool)}
            span.add_event(str(e["activity"]), attributes=attrs, timestamp=when + o)
        span.end(end_time=at["REQUEST_END"] + o)
        return span

    def door(self, span: Any, stamps: Sequence[tuple[str, int]]) -> None:
        """The front door's timestamps of a request whose span is ``span``: a child span ``HTTP`` or
        ``GRPC`` from its first to its last, each one an event."""
        from opentelemetry import trace

        if span is None or not stamps:
            return
        o = self.offset_ns
        times = [ns for _, ns in stamps]
        door = self.tracer.start_span(
            stamps[0][0].split("_", 1)[0], context=trace.set_span_in_context(span), start_time=min(times) + o
        )
        for name, ns in stamps:
            door.add_event(name, timestamp=ns + o)
        door.end(end_time=max(times) + o)

    def close(self) -> None:
        """Export what is queued, then stop the exporter's thread."""
        self.provider.shutdown()
