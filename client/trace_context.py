"""The W3C trace context a request carries: the caller's ``trace_context=``, else the active OpenTelemetry
span's, so that the server's trace of the request continues the caller's trace.

OpenTelemetry is looked at only where the program has imported it already (``opentelemetry.trace`` in
``sys.modules``): the SDK never imports it, so a program without it pays one dictionary lookup.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from .protocol import TRACEPARENT

OTEL_MODULE = "opentelemetry.trace"
"""The module whose presence in ``sys.modules`` says the program uses OpenTelemetry."""


def active_traceparent() -> str | None:
    """The ``traceparent`` of the active OpenTelemetry span, or None (no OpenTelemetry, no valid span)."""
    otel = sys.modules.get(OTEL_MODULE)
    if otel is None:
        return None
    try:
        ctx = otel.get_current_span().get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0xFF:02x}"
    except Exception:  # noqa: BLE001 - a broken tracing setup must not fail the request
        return None


def with_trace_context(
    parameters: Mapping[str, Any] | None, trace_context: str | None
) -> Mapping[str, Any] | None:
    """``parameters`` with the request's ``traceparent``: ``trace_context`` when given, else one the
    parameters name already, else the active OpenTelemetry span's, else none."""
    if trace_context is None:
        if parameters is not None and TRACEPARENT in parameters:
            return parameters
        trace_context = active_traceparent()
        if trace_context is None:
            return parameters
    return {**(parameters or {}), TRACEPARENT: trace_context}
