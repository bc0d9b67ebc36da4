"""Listening addresses (``HOST:PORT``) the server's doors check before they bind: whether one is on this
host's loopback, and why a front door may not listen on one. Shared by the broker (its TCP frontend, and
``zinfer serve`` before it starts a front door) and the front-door processes (which check again)."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "listen_problem"]


def is_loopback(address: str) -> bool:
    """Whether ``address`` (``HOST:PORT``; ``[v6]:PORT``; ``localhost:PORT``) is on the loopback."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_problem(address: str, tls: bool, insecure_remote: bool) -> str | None:
    """Why a front door may not listen on ``address``, or None: a non-loopback address needs TLS or an
    explicit ``--insecure-remote``."""
    if is_loopback(address) or tls or insecure_remote:
        return None
    return (
        f"{address} is not a loopback address: give --tls-cert and --tls-key (and --tls-client-ca for mutual "
        "TLS), or --insecure-remote to serve it without encryption"
    )
