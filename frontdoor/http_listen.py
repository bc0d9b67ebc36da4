"""Where the HTTP door listens and whose share a connection counts against: its listening socket
(SO_REUSEPORT, so every front-door process binds it), its TLS context, and a connection's per-peer key."""

from __future__ import annotations

import ipaddress
import socket
import ssl

from .door import FrontDoor
from .http_wire import HttpWire


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
