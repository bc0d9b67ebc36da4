"""CURVE keys of a client of a CURVE-secured TCP server (``zinfer serve --tcp ... --curve-secret-key``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import zmq

from .errors import ClientError

__all__ = ["CurveKeys"]


@dataclass(frozen=True)
class CurveKeys:
    """Keys for a CURVE-secured TCP server (Z85 text or raw 32 bytes)."""

    server_public: bytes
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of the server (before it connects)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    @classmethod
    def from_files(
        cls, server_cert: str | os.PathLike[str], client_secret_cert: str | os.PathLike[str]
    ) -> CurveKeys:
        """From files written by ``zinfer keys``: the server's public one and the client's secret one."""
        import zmq.auth

        server_public, _ = zmq.auth.load_certificate(os.fspath(server_cert))
        public, secret = zmq.auth.load_certificate(os.fspath(client_secret_cert))
        if secret is None:
            raise ClientError(f"{client_secret_cert}: no secret key in the file")
        return cls(server_public, public, secret)
