"""The server half of region hand-off: a Unix socket where clients hand over their segments' descriptors.

Each connection carries one datagram (``client.region_handoff``): a token and exactly one descriptor. The
descriptor is kept only if it is a sealed memory file the server can trust not to change size under a
mapping (``F_SEAL_SHRINK``, and no write seal that would make the workers' mappings fail), of a size within
the limits. It then waits, under its token, for the ``REGISTER`` that claims it on the client's ZeroMQ
connection; unclaimed descriptors are closed after ``TOKEN_TTL_S``.

Everything is bounded: connections open at once, descriptors waiting, bytes per datagram. A connection that
sends nothing is closed when its turn comes to expire; nothing here blocks the broker loop.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zinfer.client.errors import InvalidArgument, ResourceExhausted
from zinfer.client.region_handoff import MAGIC, TOKEN_BYTES

log = logging.getLogger(__name__)

TOKEN_TTL_S = 10.0
MAX_CONNECTIONS = 64
MAX_WAITING = 256
_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)


@dataclass(frozen=True)
class HandedRegion:
    """A descriptor a client handed over, waiting for the REGISTER that names its token."""

    fd: int
    size: int
    dev: int
    ino: int
    uid: int
    expires: float


def check_sealed(fd: int, max_bytes: int) -> os.stat_result:
    """Raise ``InvalidArgument`` unless ``fd`` is a sealed memory file of an acceptable size."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument("the descriptor is not a shared-memory segment")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if not seals & fcntl.F_SEAL_SHRINK:
        raise InvalidArgument("the segment must be a memory file sealed against shrinking (F_SEAL_SHRINK)")
    if seals & (fcntl.F_SEAL_WRITE | _SEAL_FUTURE_WRITE):
        raise InvalidArgument("the segment is sealed against writing: outputs could not be written to it")
    if st.st_size <= 0:
        raise InvalidArgument("the segment is empty")
    if max_bytes and st.st_size > max_bytes:
        raise ResourceExhausted(f"the segment's {st.st_size} bytes are over the {max_bytes} byte limit")
    return st


class RegionIntake:
    """The hand-off socket. ``watch`` adds descriptors to the broker's poller; ``on_readable`` handles one."""

    def __init__(
        self,
        path: Path,
        max_region_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.max_region_bytes = max_region_bytes
        self._clock = clock
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.setblocking(False)
        old = os.umask(0o177)
        try:
            self.sock.bind(os.fspath(path))
        finally:
            os.umask(old)
        self.sock.listen(MAX_CONNECTIONS)
        self._conns: dict[int, tuple[socket.socket, float]] = {}  # fd -> (connection, when to give up)
        self._waiting: dict[bytes, HandedRegion] = {}
        self._on_watch: Callable[[int, bool], None] | None = None

    def like(self, socket_path: Path) -> None:
        """Give the hand-off socket the client socket's group and mode (``--socket-group``)."""
        st = os.stat(socket_path)
        os.chown(self.path, -1, st.st_gid)
        os.chmod(self.path, stat.S_IMODE(st.st_mode))

    def watch(self, on_watch: Callable[[int, bool], None]) -> None:
        """``on_watch(fd, True)`` for every descriptor to poll for reading, ``(fd, False)`` when one goes."""
        self._on_watch = on_watch
        on_watch(self.sock.fileno(), True)

    def fds(self) -> set[int]:
        return {self.sock.fileno(), *self._conns}

    def on_readable(self, fd: int) -> None:
        if fd == self.sock.fileno():
            self._accept()
        elif fd in self._conns:
            self._receive(fd)

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the client sees its connection closed
                log.warning("event=region_handoff_accept_failed error=%r", exc.strerror)
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                conn.close()
                log.warning("event=region_handoff_refused reason=too_many_connections")
                continue
            conn.setblocking(False)
            self._conns[conn.fileno()] = (conn, self._clock() + TOKEN_TTL_S)
            if self._on_watch is not None:
                self._on_watch(conn.fileno(), True)

    def _close_conn(self, fd: int) -> None:
        conn, _ = self._conns.pop(fd)
        if self._on_watch is not None:
            self._on_watch(fd, False)
        conn.close()

    def _receive(self, fd: int) -> None:
        conn, _ = self._conns[fd]
        try:
            data, fds, flags, _ = socket.recv_fds(conn, 64, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(fd)
            return
        try:
            if not data and not fds:
                return  # the client went away
            reply = self._take(conn, data, fds, flags)
            fds = []  # taken over (or closed) by _take
            conn.send(reply)
        except OSError:
            pass
        finally:
            for extra in fds:
                os.close(extra)
            self._close_conn(fd)

    def _take(self, conn: socket.socket, data: bytes, fds: list[int], flags: int) -> bytes:
        """Check one datagram; its descriptor waits under its token. The reply for the client."""
        try:
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or len(fds) != 1:
                raise InvalidArgument("send exactly one descriptor with the token")
            if len(data) != len(MAGIC) + TOKEN_BYTES or not data.startswith(MAGIC):
                raise InvalidArgument("malformed hand-off message")
            token = data[len(MAGIC) :]
            if token in self._waiting:
                raise InvalidArgument("token already in use")
            if len(self._waiting) >= MAX_WAITING:
                raise ResourceExhausted("too many segments are waiting for their REGISTER")
            st = check_sealed(fds[0], self.max_region_bytes)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            uid = int.from_bytes(creds[4:8], "little")
        except (InvalidArgument, ResourceExhausted) as exc:
            for f in fds:
                os.close(f)
            log.info("event=region_handoff_refused error=%r", str(exc))
            return b"\x01" + str(exc).encode()
        except OSError as exc:
            for f in fds:
                os.close(f)
            reason = errno.errorcode.get(exc.errno or 0, "")
            return b"\x01" + f"cannot inspect the descriptor: {reason}".encode()
        self._waiting[token] = HandedRegion(fds[0], st.st_size, st.st_dev, st.st_ino, uid,
                                            self._clock() + TOKEN_TTL_S)  # fmt: skip
        return b"\x00"

    def claim(self, token: object) -> HandedRegion:
        """The descriptor handed over under ``token`` (the caller owns it from now on)."""
        if not isinstance(token, bytes) or len(token) != TOKEN_BYTES:
            raise InvalidArgument("REGISTER needs the token of a segment handed over on the region socket")
        handed = self._waiting.pop(token, None)
        if handed is None:
            raise InvalidArgument("no segment was handed over under this token (or it expired)")
        return handed

    def expire(self) -> None:
        """Close descriptors nobody claimed and connections that sent nothing, past their time."""
        now = self._clock()
        for token in [t for t, h in self._waiting.items() if h.expires <= now]:
            os.close(self._waiting.pop(token).fd)
        for fd in [fd for fd, (_, until) in self._conns.items() if until <= now]:
            self._close_conn(fd)

    def close(self) -> None:
        for fd in list(self._conns):
            self._close_conn(fd)
        for handed in self._waiting.values():
            os.close(handed.fd)
        self._waiting.clear()
        self.sock.close()
        self.path.unlink(missing_ok=True)
