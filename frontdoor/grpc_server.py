"""The grpc.aio server of a front-door process: bound with SO_REUSEPORT (every front-door process on the
same port), TLS when given, message sizes bounded by ``--max-tensor-bytes``."""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2_grpc

from zinfer.client.addresses import listen_problem
from zinfer.client.errors import ConfigError

from .door import FrontDoor
from .grpc_service import InferenceService

__all__ = ["start_grpc"]


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


async def start_grpc(door: FrontDoor, address: str) -> grpc.aio.Server:
    """Start serving ``inference.GRPCInferenceService`` on ``address``; returns the running server."""
    o = door.options
    problem = listen_problem(address, o.tls, o.insecure_remote)
    if problem is not None:
        raise ConfigError(problem)
    limit = o.message_limit
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(door), server)
    credentials = _credentials(door)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise ConfigError(f"cannot listen on {address}")
    await server.start()
    return server
