"""The HTTP side of the broker: ``/metrics`` and the KServe v2 health endpoints, on a background thread.

=========================================  ============================================================
``GET /metrics``                           the Prometheus exposition text
``GET /v2/health/live``                    200 while the broker runs, else 503
``GET /v2/health/ready``                   200 once every model that should be loaded is ready (none failed)
``GET /v2/models/<m>/ready``               200 if some version of ``m`` is ready, 503 if not, 404 unknown
``GET /v2/models/<m>/versions/<v>/ready``  200 / 503, 404 for an unknown model or version
=========================================  ============================================================

The handlers never touch broker state: health is an immutable ``HealthSnapshot`` that the broker
replaces whole whenever it changes, read through the ``health`` callback; metrics come from the
``metrics`` callback (``ServerMetrics.render``). Connections are bounded in number and in time.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["DEFAULT_ADDRESS", "HealthSnapshot", "HttpEndpoints"]

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = ("127.0.0.1", 8002)
_EMPTY: Mapping[str, Mapping[int, bool]] = MappingProxyType({})


@dataclass(frozen=True)
class HealthSnapshot:
    """What the health endpoints answer. ``models`` maps name -> version -> ready; a model that failed to
    load, with no version serving, maps to an empty mapping (503, not 404)."""

    live: bool = False
    ready: bool = False
    models: Mapping[str, Mapping[int, bool]] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def build(
        cls, live: bool, ready: bool, versions: Iterable[tuple[str, int | None, bool]]
    ) -> HealthSnapshot:
        """From ``(model, version, ready)`` triples; version ``None`` only names a model (no versions)."""
        models: dict[str, dict[int, bool]] = {}
        for name, version, ok in versions:
            entry = models.setdefault(name, {})
            if version is not None:
                entry[version] = ok
        frozen = {name: MappingProxyType(v) for name, v in models.items()}
        return cls(live, ready, MappingProxyType(frozen))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], endpoints: HttpEndpoints, max_connections: int) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.endpoints = endpoints
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # too many open connections: drop this one
            log.debug("event=http_busy client=%s", client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 5.0  # seconds a connection may take to send its request and read the answer
    server_version = "zinfer"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, head: bool) -> None:
        endpoints = self.server.endpoints
        try:
            status, ctype, body = endpoints.route(urlsplit(self.path).path)
        except Exception:  # a callback bug must not kill the thread silently
            log.warning("event=http_handler_failed path=%s", self.path, exc_info=True)
            status, ctype, body = 500, "text/plain; charset=utf-8", b"internal error\n"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("event=http_request client=%s line=%r", self.client_address[0], format % args)


_TEXT = "text/plain; charset=utf-8"


class HttpEndpoints:
    """Serves ``/metrics`` and health on ``host:port`` (port 0: any free port, see ``port``)."""

    def __init__(
        self,
        metrics: Callable[[], bytes],
        health: Callable[[], HealthSnapshot],
        *,
        host: str = DEFAULT_ADDRESS[0],
        port: int = DEFAULT_ADDRESS[1],
        metrics_content_type: str = CONTENT_TYPE_LATEST,
        max_connections: int = 32,
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self._port = port
        self._content_type = metrics_content_type
        self._max_connections = max_connections
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0)."""
        return self._port

    def start(self) -> None:
        """Bind and serve on a daemon thread; raises ``OSError`` if the address cannot be bound."""
        if self._server is not None:
            return
        self._server = _Server((self.host, self._port), self, self._max_connections)
        self._port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="zinfer-http", daemon=True
        )
        self._thread.start()
        log.info("event=http_listening address=%s:%d", self.host, self._port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close the socket and join the thread."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout)

    def route(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``; runs on the HTTP threads."""
        if path == "/metrics":
            return 200, self._content_type, self.metrics()
        if path == "/v2/health/live":
            return _status(self.health().live)
        if path == "/v2/health/ready":
            snap = self.health()
            return _status(snap.live and snap.ready)
        parts = path.strip("/").split("/")
        if len(parts) in (4, 6) and parts[:2] == ["v2", "models"] and parts[-1] == "ready":
            name = unquote(parts[2])
            versions = self.health().models.get(name)
            if versions is None:
                return _not_found(f"Request for unknown model: '{name}' is not found")
            if len(parts) == 4:
                return _status(any(versions.values()))
            if parts[3] == "versions" and parts[4].isdigit() and int(parts[4]) in versions:
                return _status(versions[int(parts[4])])
            if parts[3] == "versions":
                return _not_found(f"Request for unknown model: '{name}' version {parts[4]} is not found")
        return _not_found("not found")


def _status(ok: bool) -> tuple[int, str, bytes]:
    return (200, _TEXT, b"") if ok else (503, _TEXT, b"")


def _not_found(message: str) -> tuple[int, str, bytes]:
    return 404, "application/json", json.dumps({"error": message}).encode() + b"\n"
