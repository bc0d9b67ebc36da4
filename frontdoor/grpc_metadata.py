"""What a gRPC call's metadata asks of the door: Triton's ``triton_grpc_error`` header, the caller's W3C
``traceparent``."""

from __future__ import annotations

from typing import Any

__all__ = ["error_mode", "traceparent"]


def error_mode(context: Any) -> bool:
    """Whether the stream's client sent Triton's ``triton_grpc_error: true`` header."""
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:  # noqa: BLE001 - a context without metadata (tests' stand-ins)
        return False
    return any(k == "triton_grpc_error" and str(v).lower() == "true" for k, v in metadata)


def traceparent(context: Any) -> str:
    """The W3C ``traceparent`` of a call's metadata ("" when it has none)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            return value
    return ""
