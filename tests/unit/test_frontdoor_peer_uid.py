"""Who is at the other end of a connection (``frontdoor.peer_uid``), asked of the kernel on real sockets:
a Unix socket's SO_PEERCRED, a loopback TCP peer's own socket (by NETLINK_SOCK_DIAG and by the
/proc/net/tcp fallback, IPv4, IPv6 and IPv4-mapped), and nothing for a peer that has gone or is remote."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from zinfer.frontdoor import peer_uid
from zinfer.frontdoor.door import grpc_peer_uid
from zinfer.frontdoor.peer_uid import socket_peer_uid

ME = os.getuid()


@contextmanager
def _connected(family: int, listen: str, connect: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client, server-side) sockets of one loopback TCP connection."""
    with socket.socket(family) as server:
        server.bind((listen, 0))
        server.listen()
        client = socket.socket(socket.AF_INET6 if ":" in connect else socket.AF_INET)
        try:
            client.connect((connect, server.getsockname()[1]))
            accepted, _ = server.accept()
            with accepted:
                yield client, accepted
        finally:
            client.close()


def test_a_unix_socket_peer_is_named_by_peercred() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert socket_peer_uid(a) == ME


@pytest.mark.parametrize(
    ("family", "listen", "connect"),
    [(socket.AF_INET, "127.0.0.1", "127.0.0.1"), (socket.AF_INET6, "::1", "::1"),
     (socket.AF_INET6, "::", "127.0.0.1"), (socket.AF_INET6, "::", "::ffff:127.0.0.1")],
)  # fmt: skip
def test_a_loopback_peer_is_named_by_its_own_socket(family: int, listen: str, connect: str) -> None:
    with _connected(family, listen, connect) as (_client, accepted):
        assert socket_peer_uid(accepted) == ME


def test_the_proc_tables_answer_where_netlink_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_netlink(*args: object) -> int | None:
        raise OSError("no NETLINK_SOCK_DIAG here")

    monkeypatch.setattr(peer_uid, "_diag_lookup", no_netlink)
    cases = ((socket.AF_INET, "127.0.0.1", "127.0.0.1"), (socket.AF_INET6, "::", "::1"))
    for family, listen, connect in cases:
        with _connected(family, listen, connect) as (_client, accepted):
            assert socket_peer_uid(accepted) == ME


def test_a_peer_that_closed_its_end_is_not_taken_for_root() -> None:
    """Its orphaned socket is listed with uid 0 and no inode: the answer is None, not 0."""
    with _connected(socket.AF_INET, "127.0.0.1", "127.0.0.1") as (client, accepted):
        client.close()
        time.sleep(0.05)
        assert socket_peer_uid(accepted) is None


def test_a_remote_or_unmatched_peer_is_unknown() -> None:
    assert peer_uid.peer_uid(("192.0.2.7", 5000), [("192.0.2.1", 8000)]) is None  # not on this host
    assert peer_uid.peer_uid(("127.0.0.1", 1), [("127.0.0.1", 1)]) is None  # no such connection
    assert peer_uid.peer_uid(("not an address", 1), [("127.0.0.1", 1)]) is None


def test_grpc_peer_strings() -> None:
    with _connected(socket.AF_INET6, "::", "127.0.0.1") as (client, accepted):
        port, ours = client.getsockname()[1], accepted.getsockname()[1]
        assert grpc_peer_uid(f"ipv4:127.0.0.1:{port}", f"[::]:{ours}") == ME  # a wildcard: candidates
        assert grpc_peer_uid(f"ipv4:127.0.0.1:{port}", f"127.0.0.1:{ours}") == ME
        assert grpc_peer_uid(f"ipv4:127.0.0.1:{port}", f"127.0.0.1:{ours + 1}") is None
    with _connected(socket.AF_INET6, "::1", "::1") as (client, accepted):
        port, ours = client.getsockname()[1], accepted.getsockname()[1]
        assert grpc_peer_uid(f"ipv6:%5B::1%5D:{port}", f"[::1]:{ours}") == ME  # newer gRPC quotes it
        assert grpc_peer_uid(f"ipv6:[::1]:{port}", f"localhost:{ours}") == ME
    assert grpc_peer_uid("unix:/run/x.sock", "127.0.0.1:1") is None
    assert grpc_peer_uid("ipv4:192.0.2.7:5000", "0.0.0.0:8001") is None
