"""The grpc.aio server of a front-door process: bound with SO_REUSEPORT (every front-door process on the
same port), TLS when given, message sizes bounded by ``--max-tensor-bytes``.

With the ``frontdoor-native`` extra (pygrpc-native) installed, an insecure port is served by its
grpc.aio-compatible server, whose HTTP/2 and gRPC framing run in Rust outside the GIL: the same servicer,
the same statuses and texts, unary calls (every one but ModelStreamInfer) answered natively, the stream by a
grpcio server behind it on a Unix socket. TLS stays on grpcio. ``ZINFER_GRPC_SERVER=grpcio`` keeps grpcio
regardless (``native`` insists on pygrpc-native: an error when it is missing)."""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from zinfer.client.addresses import listen_problem
from zinfer.client.errors import ConfigError

from .door import FrontDoor
from .grpc_native import lean_server
from .grpc_service import InferenceService

__all__ = ["SERVER_ENV", "start_grpc", "use_native"]

log = logging.getLogger(__name__)

SERVER_ENV = "ZINFER_GRPC_SERVER"


def use_native(tls: bool) -> bool:
    """Whether the gRPC door runs on pygrpc-native: installed, asked for or not refused, and no TLS."""
    choice = os.environ.get(SERVER_ENV, "").strip().lower()
    if choice not in ("", "grpcio", "native"):
        raise ConfigError(f"{SERVER_ENV} must be 'grpcio' or 'native', got {choice!r}")
    if choice == "grpcio" or tls:
        return False
    found = importlib.util.find_spec("pygrpc_native") is not None
    if choice == "native" and not found:
        hint = "pip install 'zinfer[frontdoor-native]'"
        raise ConfigError(f"{SERVER_ENV}=native but pygrpc-native is not installed: {hint}")
    return found


def _server(options: list[tuple[str, Any]], native: bool) -> Any:
    if native:  # an optional extra: imported by name, so the door types check without it installed
        return lean_server(options, RAW, SERVICE)
    return grpc.aio.server(options=options)


def _credentials(door: FrontDoor) -> grpc.ServerCredentials | None:
    o = door.options
    if not o.tls:
        return None
    assert o.tls_cert is not None and o.tls_key is not None
    ca = o.tls_client_ca.read_bytes() if o.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(o.tls_key.read_bytes(), o.tls_cert.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


SERVICE = "inference.GRPCInferenceService"
RAW = frozenset(("ModelInfer",))
"""Methods whose handler takes the request's wire bytes and returns the response's (it reads and writes them
itself: grpc_request, grpc_response)."""


def _add_service(servicer: InferenceService, server: Any) -> None:
    """Triton's service on ``server``, every method as tritonclient's generated code registers it (by its
    descriptor) but those of ``RAW``, registered without a request deserializer and a response serializer."""
    handlers = {}
    for method in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request = getattr(service_pb2, method.input_type.name)
        response = getattr(service_pb2, method.output_type.name)
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=None if method.name in RAW else request.FromString,
            response_serializer=None if method.name in RAW else response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


async def start_grpc(door: FrontDoor, address: str) -> Any:
    """Start serving ``inference.GRPCInferenceService`` on ``address``; returns the running server."""
    o = door.options
    problem = listen_problem(address, o.tls, o.insecure_remote)
    if problem is not None:
        raise ConfigError(problem)
    limit = o.message_limit
    options: list[tuple[str, Any]] = [
        ("grpc.so_reuseport", 1),
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
    ]
    native = use_native(o.tls)
    server = _server(options, native)
    _add_service(InferenceService(door), server)
    credentials = _credentials(door)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise ConfigError(f"cannot listen on {address}")
    await server.start()
    log.info("event=grpc_server address=%s server=%s", address, "pygrpc-native" if native else "grpcio")
    return server
