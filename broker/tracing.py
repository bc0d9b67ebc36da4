"""Per-request traces: which requests are traced, their timestamps, and where the records go.

The broker's hot path asks one question of a ``Tracer`` when tracing is off: ``tracer.on`` (a plain
attribute, false unless some settings trace). Admission calls ``start`` for each request while it is on
(sampling every ``rate``-th request of a model, up to ``count`` traces); completion calls ``batch_done``
when a traced request's batch returns.

Timestamps are ``CLOCK_MONOTONIC`` nanoseconds, as Triton's (a steady clock). The broker reads its own
clock only: REQUEST_START when admission begins, QUEUE_START when the request joins its queue,
REQUEST_END as its reply is sent. The compute timestamps are derived from the batch's send time S and
receive time R at the broker and the worker's reported compute durations (input, infer, output; together C):
the time on the wire both ways is ``W = R - S - C``, taken as half each way, so COMPUTE_START = S + W/2,
COMPUTE_INPUT_END = COMPUTE_START + input, COMPUTE_OUTPUT_START = COMPUTE_INPUT_END + infer, COMPUTE_END =
COMPUTE_OUTPUT_START + output. No clock of another process is read, so the record stays consistent
whatever namespace a worker runs in. The requests of a run (several executions in one EXECUTE) share the
run's timings.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from zinfer.client import protocol
from zinfer.client.errors import Status
from zinfer.client.protocol import TRACE_ID, TRACEPARENT, Frame, InferRequest, Reply, ShmRef
from zinfer.client.worker_protocol import WorkerResult

from .model_state import InFlight
from .trace_file import TraceFile
from .trace_otel import OtelOutput
from .trace_settings import TraceSettings, update
from .trace_tensors import as_backend_inputs, input_entries, output_entries

MAX_ISSUED = 4096  # traced requests whose context a BLS call may name (the running ones, bounded)
MAX_RECENT = 4096  # answered traces the door may still add its timestamps to (the latest, bounded)
DOOR_STAMPS = frozenset({
    "HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END",
    "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END",
})  # fmt: skip
MAX_MODEL_SETTINGS = 1024  # models with their own trace settings (each an entry the broker keeps)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse_traceparent(value: object) -> tuple[str, str] | None:
    """``(trace_id, parent_span_id)`` of a W3C ``traceparent``, or None where it is not a valid one (a
    trace that cannot be continued starts afresh, as the W3C recommendation says)."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
        return None
    trace_id, span_id = m.group(2), m.group(3)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


@dataclass(slots=True)
class Trace:
    id: int
    model: str
    version: int
    request_id: str
    request_start_ns: int
    queue_start_ns: int
    log_frequency: int
    parent: tuple[str, str] | None = None  # the W3C trace id and parent span id this trace continues
    parent_id: int | None = None  # an ensemble step's: the ensemble request's trace
    parent_trace: Trace | None = None
    span: Any = None  # opentelemetry mode, an ensemble's: its span, begun when its first step is traced
    end_ns: int = 0  # an ensemble's: when it answered (its last step's reply came before that)
    context: str = ""  # its own W3C traceparent, handed to its model (``Tracer._issue``) for BLS calls
    tensors: list[dict[str, Any]] | None = None  # level TENSORS: its tensor entries (``trace_tensors``)
    compute: tuple[tuple[str, int], ...] | None = None  # its batch's compute timestamps, once it ran
    own: dict[str, Any] | None = None  # its batch's figures (zinfer's own), once it ran
    status: Status = Status.OK  # how it was answered
    cached: bool = False  # answered from the response cache
    outputs_read: bool = False
    done: bool = False  # its record has gone to the output


@dataclass
class _Sampler:
    settings: TraceSettings
    seen: int = 0


@dataclass
class Tracer:
    """The server's trace settings (global and per model) and its trace output."""

    settings: TraceSettings = field(default_factory=TraceSettings)
    on: bool = False  # whether any settings trace: the only thing the hot path reads when tracing is off
    _global: _Sampler = field(init=False)
    _models: dict[str, _Sampler] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    output: TraceFile = field(init=False)
    collected: int = 0
    # traced requests not yet finished: ``on`` stays true until they are (one that never finishes, being
    # cancelled or failed, keeps it true; that costs a look at each batch's requests, nothing more)
    _open: int = 0
    _issued: dict[str, Trace] = field(default_factory=dict)  # by the span id of its ``context``
    otel: OtelOutput | None = field(init=False)
    # answered traces by TRACE_ID, for the door's timestamps: (id, OpenTelemetry span), nothing bigger
    _recent: OrderedDict[str, tuple[int, Any]] = field(default_factory=OrderedDict)
    # level TENSORS: a read-only view of a region's range (the response cache's ``RegionReader.read``)
    read: Any = field(default_factory=lambda: lambda ref: None)

    def __post_init__(self) -> None:
        self._global = _Sampler(self.settings)
        self.output = TraceFile(self.settings.file)
        # mode opentelemetry: spans to an OTLP/HTTP collector instead of the file
        self.otel = OtelOutput(self.settings.otel) if self.settings.mode == "opentelemetry" else None
        self._refresh()

    def _refresh(self) -> None:
        self.settings = self._global.settings
        self.on = (
            self._open > 0 or self.settings.enabled or any(s.settings.enabled for s in self._models.values())
        )

    # ------------------------------------------------------------------------------------ settings

    def get(self, model: str | None) -> dict[str, str | list[str]]:
        """The settings in force for ``model`` (its own, else the global ones), in the extension's form."""
        sampler = self._models.get(model, self._global) if model else self._global
        return sampler.settings.to_wire()

    def set(self, model: str | None, changes: Mapping[str, object]) -> dict[str, str | list[str]]:
        """Apply the trace extension's ``changes`` (to ``model``'s settings, which start as a copy of the
        global ones; for a model, no changes at all removes its own settings; a value None clears it: a
        model's takes the global value, a global one its default) and return the result. A bad change is a
        ``ValueError`` and changes nothing."""
        fallback = (self._global.settings if model else TraceSettings(file=self.settings.file)).to_wire()
        changes = {k: fallback.get(k, v) if v is None else v for k, v in changes.items()}  # None: cleared
        if model and model not in self._models and changes and len(self._models) >= MAX_MODEL_SETTINGS:
            raise ValueError(f"trace settings: at most {MAX_MODEL_SETTINGS} models may have their own")
        if model:
            if not changes:
                self._models.pop(model, None)
            else:
                current = self._models.get(model)
                base = current.settings if current is not None else self._global.settings
                settings = update(base, changes)
                if current is None:
                    self._models[model] = _Sampler(settings)
                else:
                    current.settings = settings
        else:
            self._global.settings = update(self._global.settings, changes)
        self._refresh()
        return self.get(model)

    # ------------------------------------------------------------------------------------ requests

    def start(
        self,
        model: str,
        version: int,
        request_id: str,
        parameters: Mapping[str, Any],
        start_ns: int,
        request: InferRequest | None = None,
        frames: Sequence[Frame] = (),
    ) -> Trace | None:
        """A trace for this request if it is sampled (every ``rate``-th of its model's settings, while
        ``count`` lasts); QUEUE_START is now. Level TENSORS: ``request``'s inputs are recorded now."""
        parent = parse_traceparent(parameters.get(TRACEPARENT)) if TRACEPARENT in parameters else None
        if parent is not None and parent[1] in self._issued:  # a BLS call of a traced request: its child
            return self.child(self._issued[parent[1]], model, version, request_id, start_ns, request, frames)
        sampler = self._models.get(model, self._global)
        s = sampler.settings
        if not s.enabled:
            return None
        sampler.seen += 1
        if sampler.seen % s.rate:
            return None
        self._open += 1
        if s.count > 0:
            sampler.settings = replace(s, count=s.count - 1)
            self._refresh()
        t = Trace(next(self._ids), model, version, request_id, start_ns, time.monotonic_ns(), s.log_frequency,
                  parent)  # fmt: skip
        self._issue(t, parent[0] if parent else os.urandom(16).hex())
        if "TENSORS" in s.level:
            self._inputs(t, request, frames)
        return t

    def _inputs(self, t: Trace, request: InferRequest | None, frames: Sequence[Frame]) -> None:
        t.tensors = [] if request is None else input_entries(t.id, request.inputs, frames, self._read)

    def _read(self, ref: ShmRef) -> memoryview | None:
        view: memoryview | None = self.read(ref)
        return view

    def _issue(self, t: Trace, trace_id: str) -> None:
        """Give ``t`` a W3C context of its own in trace ``trace_id``, which its model sees as the
        ``traceparent`` parameter: a BLS call that passes it on is traced as ``t``'s child."""
        span_id = os.urandom(8).hex()
        t.context = f"00-{trace_id}-{span_id}-01"
        if len(self._issued) >= MAX_ISSUED:
            self._issued.pop(next(iter(self._issued)))
        self._issued[span_id] = t

    def child(
        self,
        parent: Trace,
        model: str,
        version: int,
        request_id: str | None = None,
        start_ns: int = 0,
        request: InferRequest | None = None,
        frames: Sequence[Frame] = (),
    ) -> Trace:
        """The trace of an ensemble step's request or of a BLS call, a child of the ensemble's or caller's
        (``parent_id``); it is not sampled on its own (the parent's trace decides) and does not count
        against ``count``."""
        now = time.monotonic_ns()
        start_ns = start_ns or now
        own_context = parent.context.split("-") if request_id is not None and parent.context else None
        self._open += 1
        if self.otel is not None and parent.span is None:
            parent.span = self.otel.begin(parent.model, parent.version, parent.request_id, parent.parent,
                                          parent.request_start_ns, None)  # fmt: skip
        w3c = (own_context[1], own_context[2]) if own_context else parent.parent  # a BLS call's: the caller
        rid = parent.request_id if request_id is None else request_id
        t = Trace(next(self._ids), model, version, rid, start_ns, now, parent.log_frequency, w3c, parent.id,
                  parent)  # fmt: skip
        self._issue(t, parent.context[3:35] if parent.context else os.urandom(16).hex())
        if parent.tensors is not None:
            self._inputs(t, request, frames)
        return t

    # ------------------------------------------------------------------------------------ outcomes

    def batch_ran(
        self, batch: InFlight, result: WorkerResult, frames: Sequence[Frame], received_ns: int
    ) -> None:
        """A batch came back (``received_ns``: when its RESULT came), before any of its replies leaves: its
        traced requests get their compute timestamps, batch and worker figures, and (level TENSORS) the
        outputs the model made, read while the client cannot yet reuse its output slots."""
        traced = [p for p in batch.requests if p.trace is not None]
        if not traced:
            return  # the usual case while tracing samples: nothing of this batch is traced
        timings = result.timings
        c_in, c_infer, c_out = int(timings[0]), int(timings[1]), int(timings[2])
        wire = max(0, received_ns - batch.sent_ns - (c_in + c_infer + c_out))
        compute_start = batch.sent_ns + wire // 2
        compute = (
            ("COMPUTE_START", compute_start),
            ("COMPUTE_INPUT_END", compute_start + c_in),
            ("COMPUTE_OUTPUT_START", compute_start + c_in + c_infer),
            ("COMPUTE_END", compute_start + c_in + c_infer + c_out),
        )
        own: dict[str, Any] = {
            "batch_id": batch.batch_id,
            "batch_size": sum(p.batch_size for p in batch.requests),
            "batch_requests": len(batch.requests),
            "executions": batch.executions,
            "worker": batch.worker.decode(errors="replace"),
            "dispatch_ns": batch.sent_ns,
            "result_ns": received_ns,
            "wire_ns_each_way": wire // 2,
        }
        tensors = any(p.trace is not None and p.trace.tensors is not None for p in traced)
        outputs = {r.id: r for r in result.results} if tensors else {}
        for p in traced:
            t = p.trace
            assert t is not None
            t.compute, t.own = compute, own
            r = outputs.get(p.seq)
            # a cancelled request's output slots are its client's again: not read
            if t.tensors is not None and r is not None and r.status == Status.OK and not p.cancelled:
                wired = [protocol.tensor_to_wire(o) for o in r.outputs]
                t.tensors.extend(as_backend_inputs(t.tensors))
                t.tensors.extend(output_entries(t.id, wired, frames, self._read))
                t.outputs_read = True

    def batch_done(self, batch: InFlight) -> None:
        """After a batch's replies: the traced requests answered without a reply of their own (an ensemble
        step whose outputs went straight on to its ensemble) are finished."""
        for p in batch.requests:
            if p.trace is not None and not p.trace.done:
                self.finish(p.trace)

    def replying(self, t: Trace, reply: Reply, frames: Sequence[Frame]) -> Reply:
        """Before a traced request's final reply leaves: its outcome noted, (level TENSORS) the outputs of
        a request that ran no batch of its own (an ensemble's) read, and a reply to the client marked with
        the trace's ``TRACE_ID`` parameter (the door adds its own timestamps under it)."""
        t.status = reply.status
        body = reply.body
        if reply.status != Status.OK or not isinstance(body, dict):
            return reply
        if t.tensors is not None and not t.outputs_read and not t.cached:
            t.tensors.extend(output_entries(t.id, body.get("outputs") or (), frames, self._read))
            t.outputs_read = True
        if t.parent_trace is not None:  # a step's reply goes to its ensemble, a BLS call's to its model
            return reply
        params = body.get("parameters")
        marked = {**(params if isinstance(params, dict) else {}), TRACE_ID: t.context[36:52]}
        return reply._replace(body={**body, "parameters": marked})

    def refused(self, t: Trace, status: Status) -> None:
        """A traced request refused after its trace began (its queue full, a bad sequence flag)."""
        t.status = status
        self.finish(t)

    def finish(self, t: Trace, end_ns: int = 0) -> None:
        """A traced request has been answered (whatever the outcome): its record goes to the output.
        ``end_ns``: when its reply left (0: now)."""
        if t.done:
            return
        t.done = True
        self._open -= 1
        t.end_ns = end_ns = end_ns or time.monotonic_ns()
        if t.context:
            self._issued.pop(t.context[36:52], None)
        stamps = [("REQUEST_START", t.request_start_ns), ("QUEUE_START", t.queue_start_ns)]
        if t.compute is not None:
            stamps.extend(t.compute)
        stamps.append(("REQUEST_END", _step_end(t, end_ns)))
        own: dict[str, Any] = dict(t.own) if t.own is not None else {}
        if t.status != Status.OK:
            own["status"] = t.status.name
        if t.cached:
            own["cache"] = "hit"
        if t.parent is not None:
            own["trace_id"], own["parent_span_id"] = t.parent
        self.collected += 1
        if self.otel is not None:
            parent_span = t.parent_trace.span if t.parent_trace is not None else None
            t.span = self.otel.record(t.model, t.version, t.request_id, t.parent, stamps, own, parent_span,
                                      t.span, t.tensors or ())  # fmt: skip
        else:
            self.output.add(self._entries(t, stamps, own), t.log_frequency)
        if t.context and t.parent_trace is None:  # the door may add its timestamps for a while
            self._recent[t.context[36:52]] = (t.id, t.span)
            if len(self._recent) > MAX_RECENT:
                self._recent.popitem(last=False)
        t.tensors = t.own = None  # the output has them; an ensemble's step may still hold ``t``
        if not self._open:
            self._refresh()

    def door_stamps(self, token: str, stamps: Sequence[tuple[str, int]]) -> bool:
        """The front door's own timestamps of a traced request it answered (``HTTP_RECV_START`` ...
        ``GRPC_SEND_END``), under the trace's ``TRACE_ID`` token; False for a token not (or no longer)
        known. Triton mode: one more ``timestamps`` entry of the trace; OpenTelemetry: a span ``HTTP`` or
        ``GRPC`` under the request's."""
        known = self._recent.pop(token, None)
        if known is None:
            return False
        trace_id, span = known
        kept = [(n, ns) for n, ns in stamps if n in DOOR_STAMPS]
        if not kept:
            return True
        if self.otel is not None:
            self.otel.door(span, kept)
        else:
            self.output.extra([{"id": trace_id, "timestamps": [{"name": n, "ns": ns} for n, ns in kept]}])
        return True

    @staticmethod
    def _entries(t: Trace, stamps: Sequence[tuple[str, int]], own: dict[str, Any]) -> list[dict[str, Any]]:
        head: dict[str, Any] = {"id": t.id, "model_name": t.model, "model_version": t.version,
                                "request_id": t.request_id}  # fmt: skip
        if t.parent_id is not None:
            head["parent_id"] = t.parent_id
        entries = [
            head,
            {"id": t.id, "timestamps": [{"name": n, "ns": ns} for n, ns in stamps]},
            {"id": t.id, "zinfer": own},
        ]
        if t.tensors:
            entries.extend(t.tensors)
        return entries

    def close(self) -> None:
        self.output.close()
        if self.otel is not None:
            self.otel.close()


def _step_end(t: Trace, end_ns: int) -> int:
    """REQUEST_END of a request whose batch's replies were all sent at ``end_ns``; an ensemble step's reply
    went to its ensemble before that, which may have answered already: its step ended no later."""
    parent = t.parent_trace
    if parent is not None and parent.end_ns:
        return min(end_ns, parent.end_ns)
    return end_ns
