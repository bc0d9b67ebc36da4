"""The KServe v2 HTTP/REST front door (Triton's HTTP API and extensions) on ``http_wire``'s connections.

``serve_http(door, stop)`` listens on ``door.options.http`` (SO_REUSEPORT, so every front-door process
shares the port; TLS when the options carry a certificate) until ``stop`` is set. Routes, as Triton's:

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``: server metadata; health (200, else Triton's 400,
  with the reason in the body: the models loading or failed)
- ``GET /v2/models/{m}[/versions/{v}][/ready|/config|/stats]``: model metadata, readiness, config, statistics;
  ``GET /v2/models/stats``: every model's statistics
- ``POST /v2/models/{m}[/versions/{v}]/infer``: inference with JSON and binary tensors, or shared memory
- ``POST /v2/repository/index``, ``/v2/repository/models/{m}/load|unload``: the model repository extension
- ``GET|POST /v2/systemsharedmemory[/region/{r}]/status|register|unregister``: system shared memory

CUDA shared memory answers as a Triton built without GPUs (``cudashm``: no regions, register refused with the
reason); ``GET|POST /v2[/models/{m}]/trace/setting`` is Triton's trace extension; log settings answer 501.
Errors are ``{"error": "..."}`` with Triton's HTTP status (400, 404, 503, 501, 500) and text. The request body
is bounded (``Limits.max_body_bytes`` for an infer, ``CONTROL_BODY_BYTES`` else) and must arrive within
``http_wire.REQUEST_TIMEOUT_S``, its line and headers within ``--http-header-timeout``; open connections are
bounded by ``MAX_CONNECTIONS`` in all and by ``--http-peer-connections`` per peer (per uid for a peer on this
host, which the kernel names; per address otherwise), so one peer trickling bytes into many connections cannot
hold the door (slowloris).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from zinfer.client.errors import InvalidArgument, ZinferError

from . import cudashm
from .bridge import HEALTH_TIMEOUT_S
from .bridge_records import NONE, InferCall, RepositoryModel, Tensor
from .classification import classify_reply
from .door import FrontDoor
from .errors import FrontDoorError, triton_error
from .http_codec import (
    HEADER_LENGTH,
    HttpInferRequest,
    Limits,
    ShmRef,
    load_overrides,
    parse_header_length,
    resolve_inputs,
)
from .http_direct import DirectPath, written_response
from .http_known import MODEL_ROUTE as _MODEL
from .http_known import InferTargets, KnownReplies, KnownRequests
from .http_listen import Connections, listen_socket, tls_context
from .http_messages import HttpRequest, HttpResponse
from .http_reply import tensor_to_bytes
from .http_views import (
    dumps,
    error_body,
    model_metadata,
    not_ready_reason,
    optional_json,
    repository_index,
    server_metadata,
    shm_register_body,
    shm_status,
    statistics,
)
from .http_wire import HttpWire
from .sysshm import CallerShm

__all__ = ["CONTROL_BODY_BYTES", "MAX_CONNECTIONS", "HttpFrontDoor", "http_status", "serve_http"]

log = logging.getLogger(__name__)

CONTROL_BODY_BYTES = 1 << 20  # the body of a request that is not an infer (JSON of a few fields)
MAX_CONNECTIONS = 1024
STOP_GRACE_S = 2.0
_HEADER_LENGTH = HEADER_LENGTH.lower()
_TRACEPARENT = "traceparent"
_JSON = "application/json"
_NO_SHM: frozenset[str] = frozenset()

_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_CONTROL = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_SYSSHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_CUDASHM = re.compile(r"/v2/cudasharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_UNSUPPORTED = re.compile(r"/v2/logging")

# Triton's HTTP statuses by error kind (HttpCodeFromError): a full queue or an expired queue timeout is
# Triton's UNAVAILABLE; whatever Triton has no code for is 400
_STATUS = {"INTERNAL": 500, "NOT_FOUND": 404, "UNAVAILABLE": 503, "RESOURCE_EXHAUSTED": 503,
           "DEADLINE_EXCEEDED": 503, "UNIMPLEMENTED": 501, "PERMISSION_DENIED": 403}  # fmt: skip


def http_status(grpc_code: str) -> int:
    return _STATUS.get(grpc_code, 400)


def _json(value: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, (dumps(value),), _JSON)


def _error(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, (error_body(message),), _JSON)


_OK = HttpResponse(200)
_OK_JSON = HttpResponse(200, (), _JSON)
_NOT_ALLOWED = _error(405, "Method Not Allowed")


class HttpFrontDoor:
    """The request handler of one front-door process (one per process, shared by its connections)."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.bridge = door.bridge
        self.limits = Limits(max_tensor_bytes=door.options.max_tensor_bytes)
        self.requests, self.replies = KnownRequests(self.limits), KnownReplies()  # kept (``http_known``)
        self.targets = InferTargets()
        self.direct = DirectPath(self.bridge, self.replies, self._finish)
        self._counts: dict[str, int] | None = None  # ``_finish``'s: ``Counters.record`` inline, no call

    def body_limit(self, method: str, target: str) -> int:
        """The most body bytes a request to ``target`` may carry (checked before the body is read)."""
        infer = target.split("?", 1)[0].endswith("/infer")
        return self.limits.max_body_bytes if infer else CONTROL_BODY_BYTES

    async def handle(self, request: HttpRequest) -> HttpResponse:
        try:
            found = self.targets.get(request.target) if request.method == "POST" else None
            if found is not None:  # an inference: straight to it, one coroutine less
                response = await self._infer(request, found[0], found[1])
            else:
                response = await self._route(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes Triton's answer, never a 500 page
            response = _failed(request, exc)
        self.door.counters.record("http", response.status < 400)
        return response

    def start(self, request: HttpRequest, done: Callable[[HttpResponse], None]) -> bool:
        """``handle`` without a coroutine for a request the direct path sends at once (``http_direct``):
        ``done`` is called by the loop with its answer. False (nothing done): ``handle`` answers it."""
        if request.method != "POST":
            return False
        found = self.targets.get(request.target)
        if found is None:
            return False
        model, version = found
        headers = request.headers
        if self.bridge._decoupled.get((model, version)) is not False or _TRACEPARENT in headers:
            return False
        body = request.body
        try:
            header_length = parse_header_length(headers.get(_HEADER_LENGTH), len(body))
        except InvalidArgument:  # answered by ``handle``
            return False
        known = self.requests.header(body, header_length)
        if known is None or not known.plans:
            return False
        return self.direct.start(known, request, header_length, model, version, done)

    def _finish(
        self, request: HttpRequest, done: Callable[[HttpResponse], None], answer: HttpResponse | BaseException
    ) -> None:
        """A direct request's answer, as ``handle`` gives it."""
        response = answer if isinstance(answer, HttpResponse) else _failed(request, answer)
        counts = self._counts = self._counts or self.door.counters.entry("http")  # ``record``, inline
        counts["ok" if response.status < 400 else "failed"] += 1
        done(response)

    async def _route(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        method = request.method
        if m := _MODEL.fullmatch(path):  # inference first (the routes' patterns are disjoint)
            model, version, kind = unquote(m.group(1)), m.group(2) or "", m.group(3) or ""
            if kind == "infer" and method == "POST":
                return await self._infer(request, model, version)
            return await self._model(request, model, version, kind)
        if m := _SERVER.fullmatch(path):
            if method != "GET":
                return _NOT_ALLOWED
            if m.group(1) is None:
                return _json(server_metadata(self.bridge.server_metadata()))
            if m.group(1) == "live":
                live = await self.bridge.server_live()
                return _OK if live else _error(400, "Server is not live: the zinfer server does not answer")
            if await self.bridge.server_ready():
                return _OK
            return _error(400, not_ready_reason(await self._index_or_none()))
        if m := _CONTROL.fullmatch(path):
            if method != "POST":
                return _NOT_ALLOWED
            return await self._repository(request, m.group(1), unquote(m.group(3) or ""), m.group(4) or "")
        if m := _SYSSHM.fullmatch(path):
            return await self._system_shm(request, unquote(m.group(1) or ""), m.group(2))
        if m := _CUDASHM.fullmatch(path):
            region, action = unquote(m.group(1) or ""), m.group(2)
            if (action == "status") != (method == "GET") or method not in ("GET", "POST"):
                return _NOT_ALLOWED
            if action == "status":
                return _json(list(cudashm.status(region)))
            if action == "register":
                cudashm.register(region)
            cudashm.unregister(region)
            return _OK_JSON
        if path == "/v2/trace/setting":
            return await self._trace(request, "")
        if _UNSUPPORTED.fullmatch(path):
            raise FrontDoorError("UNIMPLEMENTED", 501, "log settings are not supported by zinfer")
        return _error(400, "Not Found")

    async def _index_or_none(self) -> tuple[RepositoryModel, ...] | None:
        try:
            return await asyncio.wait_for(self.bridge.repository_index(), HEALTH_TIMEOUT_S)
        except (asyncio.TimeoutError, ZinferError):
            return None

    async def _model(self, request: HttpRequest, model: str, version: str, kind: str) -> HttpResponse:
        method = request.method
        if kind == "infer":
            return await self._infer(request, model, version) if method == "POST" else _NOT_ALLOWED
        if kind == "trace/setting":
            return await self._trace(request, model)
        if method != "GET":
            return _NOT_ALLOWED
        if kind == "" and model == "stats" and not version:
            return _json(statistics(await self.bridge.statistics()))
        if kind == "":
            return _json(model_metadata(await self.bridge.model_metadata(model, version)))
        if kind == "ready":
            if await self.bridge.model_ready(model, version):
                return _OK
            return _error(400, "Model version not ready")
        if kind == "config":
            return _json(dict(await self.bridge.model_config(model, version)))
        return _json(statistics(await self.bridge.statistics(model, version)))  # kind "stats", the last left

    async def _trace(self, request: HttpRequest, model: str) -> HttpResponse:
        """Triton's trace extension: GET the settings, POST changes (a model's, without any: drop its own)."""
        if request.method == "GET":
            return _json(await self.bridge.trace_settings(model))
        if request.method != "POST":
            return _NOT_ALLOWED
        return _json(await self.bridge.trace_settings(model, optional_json(request.body)))

    async def _repository(
        self, request: HttpRequest, repository: str | None, model: str, action: str
    ) -> HttpResponse:
        body = optional_json(request.body)
        if repository:
            raise FrontDoorError("UNIMPLEMENTED", 501, "'repository_name' specification is not supported")
        if not action:
            ready = body.get("ready", False)
            if type(ready) is not bool:
                raise InvalidArgument("Unable to parse 'ready'")
            return _json(repository_index(await self.bridge.repository_index(ready_only=ready)))
        params = body.get("parameters", {})
        if type(params) is not dict:
            raise InvalidArgument("Unable to parse 'parameters'")
        if action == "load":
            config, files = load_overrides(params)
            await self.bridge.load(model, config, files)
        else:
            if type(params.get("unload_dependents", False)) is not bool:
                raise InvalidArgument("Unable to parse 'unload_dependents'")
            await self.bridge.unload(model)
        return _OK_JSON

    async def _system_shm(self, request: HttpRequest, region: str, action: str) -> HttpResponse:
        if (action == "status") != (request.method == "GET") or request.method not in ("GET", "POST"):
            return _NOT_ALLOWED
        shm = self.door.shm.caller(request.peer_uid)
        if action == "status":
            return _json(shm_status(shm.status(region)))
        body = request.body
        if action == "register":
            if not region:
                raise InvalidArgument("'region name' is necessary to register system shared memory region")
            key, offset, size = shm_register_body(body)
            shm.register(region, key, offset, size)
        else:
            shm.unregister(region)
        return _OK_JSON

    async def _infer(self, request: HttpRequest, model: str, version: str) -> HttpResponse:
        body = request.body
        decoupled = self.bridge.known_decoupled(model, version)  # cached: no call
        if decoupled is None:
            decoupled = await self.bridge.is_decoupled(model, version)
        if decoupled:
            text = "HTTP end point doesn't support models with decoupled transaction policy"
            raise FrontDoorError("UNIMPLEMENTED", 501, text)
        headers = request.headers
        header_length = parse_header_length(headers.get(_HEADER_LENGTH), len(body))
        known = self.requests.header(body, header_length)
        if known is not None and known.plans and _TRACEPARENT not in headers:  # ``http_direct``
            direct = await self.direct.answer(known, request, header_length, model, version)
            if direct is not None:
                return direct
        parsed = self.requests.decode_known(known, body, header_length, model)
        shm: CallerShm | None = None
        later: list[Callable[[], None]] = []  # big copies, checked, to run off the loop (copy_pool)
        if parsed.input_shm or parsed.output_shm:
            shm = self.door.shm.caller(request.peer_uid, None, later)
            # system shm straight into the bridge's arena (plain memory when the broker is not local)
            inputs = resolve_inputs(parsed, shm.read, self.limits, self.bridge.empty)
            await self.door.shm.copies.run(later)
        else:
            inputs = resolve_inputs(parsed, _no_shm, self.limits)
        call = InferCall(
            model, inputs, version, tuple([o.name for o in parsed.outputs]), parsed.request_id,
            parsed.priority, parsed.timeout_us, parsed.sequence_id, parsed.sequence_start,
            parsed.sequence_end, parsed.parameters, NONE, headers.get(_TRACEPARENT, ""),
        )  # fmt: skip
        reply = await self.bridge.infer(call)
        counts = {o.name: o.class_count for o in parsed.outputs if o.class_count}
        if counts:
            reply = await classify_reply(self.bridge, self.door.labels, reply, counts)
        in_shm = _NO_SHM
        if shm is not None and parsed.output_shm:
            in_shm = self._write_shm_outputs(shm, parsed, reply.outputs)
            await self.door.shm.copies.run(later)  # in the caller's regions before the reply says so
        written = self.replies.encode(reply, parsed, in_shm)
        if not counts and not parsed.output_shm and not call.traceparent and not reply.trace:
            # a header kept (now, if it was not: ``http_known``) and no plan yet: the next one may go direct
            known = known or self.requests.header(body, header_length)
            if known is not None and (model, version) not in known.plans:
                self.direct.plan(known, call, model, version)
        return written_response(written, self.direct.on_sent(request, reply))

    def _write_shm_outputs(
        self, shm: CallerShm, parsed: HttpInferRequest, outputs: tuple[Tensor, ...]
    ) -> frozenset[str]:
        refs: dict[str, ShmRef] = {o.name: o.shm for o in parsed.outputs if o.shm is not None}
        for tensor in outputs:
            ref = refs.get(tensor.name)
            if ref is None:
                continue
            raw = tensor_to_bytes(tensor)
            if raw.nbytes > ref.byte_size:
                raise FrontDoorError(
                    "INTERNAL", 500, f"shared memory size specified with the request for output "
                    f"'{tensor.name}' ({ref.byte_size} bytes) should be at least {raw.nbytes} bytes to hold "
                    "the results",
                )  # fmt: skip
            shm.write(ref.region, ref.offset, ref.byte_size, raw)
        return frozenset(refs)


def _failed(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """Triton's answer for a failed request."""
    answer = triton_error(exc)
    if answer.grpc_code == "INTERNAL" and not isinstance(exc, FrontDoorError):
        log.error("event=http_internal_error path=%r", request.target[:200], exc_info=exc)
    return _error(http_status(answer.grpc_code), answer.message)


def _no_shm(*args: Any) -> Any:
    raise AssertionError("a request without shared memory read from it")  # pragma: no cover


# ------------------------------------------------------------------------------------------ serving


async def serve_http(door: FrontDoor, stop: asyncio.Event) -> None:
    """Serve HTTP on ``door.options.http`` until ``stop`` is set."""
    address = door.options.http
    if not address:
        raise FrontDoorError("INVALID_ARGUMENT", 400, "no HTTP address")
    handler = HttpFrontDoor(door)
    connections = Connections(door.options.http_peer_connections, MAX_CONNECTIONS)

    def connect() -> asyncio.Protocol:
        return connections.made(lambda: HttpWire(
            handler.handle, handler.body_limit, connections.closed,
            header_timeout=door.options.http_header_timeout_s, admit=connections.admit, start=handler.start,
        ))  # fmt: skip

    sock = listen_socket(address)
    loop = asyncio.get_running_loop()
    tls = tls_context(door)
    # a TLS handshake comes before the head (and before the peer's share is counted): the same deadline
    handshake = door.options.http_header_timeout_s if tls is not None else None
    server = await loop.create_server(connect, sock=sock, ssl=tls, ssl_handshake_timeout=handshake)
    log.info("event=http_frontdoor_listening address=%s tls=%s", address, door.options.tls)
    try:
        await stop.wait()
    finally:
        server.close()
        for wire in list(connections.open):
            wire.close()  # idle ones now; one answering once its answer is written
        deadline = loop.time() + STOP_GRACE_S
        while connections.open and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await server.wait_closed()
        log.info("event=http_frontdoor_stopped address=%s", address)
