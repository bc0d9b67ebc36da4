"""The HTTP messages the front door's connections pass: ``HttpRequest`` in, ``HttpResponse`` out.

``HttpResponse.head`` writes an answer's status line and headers (status lines cached, bounded);
``plain`` is the JSON error answer a connection gives on its own (malformed, too big, too slow).
``Handler``, ``Start`` and ``BodyLimit`` are the shapes of what a server hands ``http_wire.HttpWire``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, NamedTuple

from .http_views import error_body

__all__ = ["BodyLimit", "Handler", "HttpRequest", "HttpResponse", "Start", "plain"]

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class HttpRequest(NamedTuple):
    method: str
    target: str  # the raw request target: path and query, still percent-encoded
    headers: Mapping[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes
    peer: Any  # the transport's peername: (host, port, ...) or a Unix socket path
    peer_uid: int | None = None  # the peer's uid when the kernel says it (this host), else None
    recv_start_ns: int = 0  # CLOCK_MONOTONIC when its first byte was parsed (a trace's HTTP_RECV_START)
    recv_end_ns: int = 0  # ... and its last (HTTP_RECV_END)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class HttpResponse(NamedTuple):
    status: int
    body: Sequence[bytes | memoryview] = ()
    content_type: str | None = None
    headers: Mapping[str, str] = _NO_HEADERS
    close: bool = False  # close the connection after this answer
    # a traced request's answer: told when its write began and ended (HTTP_SEND_START, HTTP_SEND_END)
    on_sent: Callable[[int, int], None] | None = None
    written: bytes | None = None  # ``head(True)``, written ahead (``http_known``): a keep-alive answer's

    def head(self, keep_alive: bool, length: int | None = None) -> bytes:
        """The status line and headers (``length``: the body's bytes, when the caller has counted them)."""
        if length is None:
            length = sum(len(part) for part in self.body)
        text = _status_line(self.status)
        if self.content_type is not None:
            text += f"Content-Type: {self.content_type}\r\n"
        for k, v in self.headers.items():
            text += f"{k}: {v}\r\n"
        text += f"Content-Length: {length}\r\n\r\n" if keep_alive else \
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        return text.encode("latin-1")


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
# the handler without a coroutine, for a request it can send on at once: True when it took the request (it
# calls the callback with the answer later, from the loop); False: the handler answers it
Start = Callable[[HttpRequest, Callable[[HttpResponse], None]], bool]
BodyLimit = Callable[[str, str], int]  # (method, target) -> the most body bytes accepted


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_STATUS_LINES: dict[int, str] = {}


def _status_line(status: int) -> str:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} {_reason(status)}\r\n"
        if len(_STATUS_LINES) < 1024:  # statuses are the door's own, but bounded all the same
            _STATUS_LINES[status] = line
    return line


def plain(status: int, message: str) -> HttpResponse:
    """An answer the connection itself gives (not the handler): a JSON error in Triton's shape."""
    return HttpResponse(status, (error_body(message),), "application/json", close=True)
