"""zinfer's exceptions as Triton answers them: a gRPC status code, an HTTP status and Triton's text.

The bridge raises zinfer's own exception tree (``zinfer.client.errors``); the protocol layers call
``triton_error`` once, at their edge. Texts that tritonclient users match on are Triton's own
(``Request for unknown model: 'm' is not found``); the rest keep zinfer's message without its class prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zinfer.client.errors import (
    AlreadyExists,
    Cancelled,
    ConnectionFailed,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ProtocolError,
    RequestTimeout,
    ResourceExhausted,
    ServerError,
    Unavailable,
    UnknownError,
    Unsupported,
    ZinferError,
)

__all__ = ["FrontDoorError", "TritonError", "triton_error", "unknown_model"]


@dataclass(frozen=True)
class TritonError:
    """``grpc_code`` is a ``grpc.StatusCode`` name (``"NOT_FOUND"``), so this module needs no grpcio."""

    grpc_code: str
    http_status: int
    message: str


class FrontDoorError(ZinferError):
    """An error the front door raises itself, with the answer it maps to."""

    def __init__(self, grpc_code: str, http_status: int, message: str) -> None:
        super().__init__(message)
        self.answer = TritonError(grpc_code, http_status, message)


# (exception class, gRPC code, HTTP status), the first match wins (subclasses before their bases)
_CODES: tuple[tuple[type[BaseException], str, int], ...] = (
    (InvalidArgument, "INVALID_ARGUMENT", 400),
    (ProtocolError, "INVALID_ARGUMENT", 400),
    (NotFound, "NOT_FOUND", 404),
    (Unavailable, "UNAVAILABLE", 503),
    (ResourceExhausted, "RESOURCE_EXHAUSTED", 429),
    (DeadlineExceeded, "DEADLINE_EXCEEDED", 504),
    (Cancelled, "CANCELLED", 499),
    (Unsupported, "UNIMPLEMENTED", 501),
    (AlreadyExists, "ALREADY_EXISTS", 409),
    (ConnectionFailed, "UNAVAILABLE", 503),
    (RequestTimeout, "DEADLINE_EXCEEDED", 504),
    (UnknownError, "UNKNOWN", 500),
)

# zinfer's texts rewritten as Triton's
_TEXTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"unknown model '(?P<m>.*)'$"), "Request for unknown model: '{m}' is not found"),
    (
        re.compile(r"unknown version (?P<v>\d+) of model '(?P<m>.*)'$"),
        "Request for unknown model: '{m}' version {v} is not found",
    ),
    (
        re.compile(r"model '(?P<m>.*)' is not loaded$"),
        "Request for unknown model: '{m}' has no available versions",
    ),
    (
        re.compile(r"no model '(?P<m>.*)' in the repository$"),
        "failed to load '{m}', failed to poll from model repository",
    ),
)


def unknown_model(model: str, version: str = "") -> NotFound:
    """Triton's error for a model (or version) that does not exist."""
    at = f" version {version}" if version else ""
    return NotFound(f"Request for unknown model: '{model}'{at} is not found")


def _text(exc: BaseException) -> str:
    message = str(exc)
    for pattern, template in _TEXTS:
        match = pattern.match(message)
        if match:
            return template.format(**match.groupdict())
    return message


def triton_error(exc: BaseException) -> TritonError:
    """How the front door answers ``exc``: any exception maps, unknown ones to INTERNAL without details."""
    if isinstance(exc, FrontDoorError):
        return exc.answer
    for cls, code, status in _CODES:
        if isinstance(exc, cls):
            return TritonError(code, status, _text(exc))
    if isinstance(exc, ServerError | ZinferError):
        return TritonError("INTERNAL", 500, _text(exc))
    return TritonError("INTERNAL", 500, "internal error in the front door")
