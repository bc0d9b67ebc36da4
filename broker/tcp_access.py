"""Clients over TCP: loopback unless CURVE is on, and with CURVE only the clients on an allow-list.

CURVE keys are ZeroMQ certificate files (``zinfer keys`` writes a pair): the server loads its secret
certificate, and every public certificate in the allow-list folder may connect. Authentication runs in
pyzmq's ZAP authenticator thread; the broker loop never sees a client that failed it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from zinfer.client.addresses import is_loopback
from zinfer.client.errors import ConfigError

log = logging.getLogger(__name__)


class TcpFrontend:
    """A ROUTER on ``tcp://address``, CURVE-authenticated when a secret certificate is given."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        address: str,
        secret_cert: Path | None,
        allow_dir: Path | None,
        max_frame_bytes: int = -1,
    ) -> None:
        if secret_cert is None and not is_loopback(address):
            raise ConfigError(
                f"refusing to accept clients on {address} without CURVE: bind a loopback address, "
                "or give --curve-secret-key and --curve-allow"
            )
        if secret_cert is not None and allow_dir is None:
            raise ConfigError(
                "--curve-secret-key needs --curve-allow (a folder of allowed client public keys)"
            )
        self.auth: ThreadAuthenticator | None = None
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)  # a larger frame is dropped, never buffered
        if secret_cert is not None and allow_dir is not None:
            public, secret = _load_secret(secret_cert)
            if not allow_dir.is_dir():
                raise ConfigError(f"--curve-allow {allow_dir}: not a folder")
            self.auth = ThreadAuthenticator(ctx, log=logging.getLogger("zinfer.broker.zap"))
            self.auth.start()
            self.auth.configure_curve(domain="*", location=str(allow_dir))
            self.sock.curve_secretkey = secret
            self.sock.curve_publickey = public
            self.sock.curve_server = True
        self.sock.bind(f"tcp://{address}")
        log.info("event=tcp_listening address=%s curve=%s", address, "on" if self.auth else "off")

    def close(self) -> None:
        self.sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()


def _load_secret(path: Path) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--curve-secret-key {path}: {exc}") from None
    if secret is None:
        raise ConfigError(f"--curve-secret-key {path}: the file holds no secret key")
    return public, secret


def create_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """Write ``name.key`` (public, to share) and ``name.key_secret`` (keep private) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(folder), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)
