"""Where the HTTP door listens and which connections it keeps: its listening socket (SO_REUSEPORT, so
every front-door process binds it), its TLS context, and ``Connections``, the open connections counted in
all and per peer (a connection past either bound is closed as it is made)."""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable

from .door import FrontDoor
from .http_wire import HttpWire

log = logging.getLogger(__name__)


def peer_key(wire: HttpWire) -> str:
    """Whose share of the connections ``wire`` counts against: its uid when the kernel says it (a peer on
    this host), else its address."""
    if wire.peer_uid is not None:
        return f"uid:{wire.peer_uid}"
    peer = wire.peer
    host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        host = str(ip)
    except ValueError:
        pass
    return f"address:{host}"


class _Refuse(asyncio.Protocol):
    """Closes a connection past the limit at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class Connections:
    """The open connections of one door process: at most ``most`` in all and ``share`` per peer
    (``peer_key``), so one peer opening many cannot hold the door."""

    def __init__(self, share: int, most: int) -> None:
        self.open: set[HttpWire] = set()
        self.per_peer: collections.Counter[str] = collections.Counter()
        self.share, self.most = share, most

    def made(self, new: Callable[[], HttpWire]) -> asyncio.Protocol:
        """The protocol for a connection just accepted: a new wire, or one that closes it at once."""
        if len(self.open) >= self.most:
            log.warning("event=http_connection_refused open=%d", len(self.open))
            return _Refuse()
        wire = new()
        self.open.add(wire)
        return wire

    def admit(self, wire: HttpWire) -> bool:
        """Whether ``wire``, its peer now known, is within its peer's share (counted if so)."""
        key = peer_key(wire)
        if self.per_peer[key] >= self.share:
            open_now = self.per_peer[key]
            log.warning("event=http_connection_refused reason=peer_share peer=%s open=%d", key, open_now)
            return False
        self.per_peer[key] += 1
        wire.admitted = True
        return True

    def closed(self, wire: HttpWire) -> None:
        self.open.discard(wire)
        if wire.admitted:
            wire.admitted = False
            key = peer_key(wire)
            self.per_peer[key] -= 1
            if self.per_peer[key] <= 0:
                del self.per_peer[key]


def listen_socket(address: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` with SO_REUSEPORT (every front-door process binds it)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)  # proto TCP: asyncio then sets TCP_NODELAY on each connection
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def tls_context(door: FrontDoor) -> ssl.SSLContext | None:
    o = door.options
    if o.tls_cert is None or o.tls_key is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(o.tls_cert), str(o.tls_key))
    if o.tls_client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(str(o.tls_client_ca))
    return ctx
