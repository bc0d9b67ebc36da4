"""Handing a segment's descriptor to the server: the client half of region registration.

A client proves it may use a segment by giving the server the segment's open descriptor (``SCM_RIGHTS`` over
a Unix socket beside the server's ZeroMQ socket): the kernel, not the client's word, says which memory is
meant, and nobody can hand over memory they cannot open. The server answers with one status byte. The
message carries a fresh random token; the client then sends ``REGISTER {name, token}`` on its ZeroMQ
connection, which binds that connection to the descriptor (a token is used once and expires in seconds).

Wire format, one ``SOCK_SEQPACKET`` datagram each way:
  client → server: ``MAGIC`` + 16-byte token, with exactly one descriptor attached;
  server → client: ``b"\\x00"`` (accepted) or ``b"\\x01"`` + a UTF-8 reason.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from .errors import ConnectionFailed, InvalidArgument

HANDOFF_SOCKET_NAME = "zinfer-regions.sock"
MAGIC = b"ZRH1"
TOKEN_BYTES = 16
MAX_REPLY = 512


def handoff_path(url: str) -> Path | None:
    """The hand-off socket beside an ``ipc://`` client socket, or None for other transports."""
    if not url.startswith("ipc://"):
        return None
    return Path(url[len("ipc://") :]).parent / HANDOFF_SOCKET_NAME


def hand_over(path: Path, fd: int, timeout: float) -> bytes:
    """Send ``fd`` to the server at ``path``; returns the token to name in ``REGISTER``.

    Raises ``ConnectionFailed`` when the server cannot be reached and ``InvalidArgument`` when it refuses
    the segment (with its reason)."""
    token = secrets.token_bytes(TOKEN_BYTES)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            sock.connect(os.fspath(path))
            socket.send_fds(sock, [MAGIC + token], [fd])
            reply = sock.recv(MAX_REPLY)
    except (OSError, TimeoutError) as exc:
        raise ConnectionFailed(f"cannot hand a shared-memory segment to the server: {exc}") from None
    if reply == b"\x00":
        return token
    if reply[:1] == b"\x01":
        raise InvalidArgument(f"cannot register region: {reply[1:].decode('utf-8', 'replace')}")
    raise ConnectionFailed("the server closed the region hand-off without an answer")
