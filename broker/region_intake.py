"""The server half of region hand-off: a Unix socket where clients hand over their segments' descriptors.

Each connection carries one datagram (``client.region_handoff``): a token and exactly one descriptor. The
descriptor is kept only if it is a memory file the server can trust never to change under a mapping: sealed
against shrinking and growing, and against any further seal (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``),
so nobody can later add a write seal that would make the workers' writable mappings fail; and with no write
seal already. Its size must be within the limits. It then waits, under its token, for the ``REGISTER`` that
claims it on the client's ZeroMQ connection; unclaimed descriptors are closed after ``TOKEN_TTL_S``.

Everything is bounded: connections open at once, descriptors waiting, bytes per datagram; and connections
and waiting descriptors per peer too (its uid and its pid, from ``SO_PEERCRED``), so one process or one user
that opens connections and sends nothing, or hands over descriptors it never claims, uses up its own share
and nobody else's. A connection that sends nothing is closed after ``CONNECTION_TTL_S``; nothing here
blocks the broker loop.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from zinfer.client.errors import InvalidArgument, ResourceExhausted
from zinfer.client.region_handoff import MAGIC, TOKEN_BYTES

log = logging.getLogger(__name__)

TOKEN_TTL_S = 10.0
CONNECTION_TTL_S = 3.0  # a client sends its datagram as soon as it connects
BACKLOG = 1024  # connections waiting to be accepted (each then judged by its peer's ceilings)
_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@dataclass(frozen=True)
class PeerLimits:
    """How much of the hand-off socket one peer may hold: connections open at once and descriptors waiting
    for their REGISTER, in all, per user (uid) and per process (pid; 0 when the peer's pid is not visible
    from the server's PID namespace, so such peers share one count and are held to their uid's)."""

    connections: int = 1024
    connections_per_uid: int = 64
    connections_per_pid: int = 16
    waiting: int = 4096
    waiting_per_uid: int = 256
    waiting_per_pid: int = 64


MAX_CONNECTIONS = PeerLimits.connections
MAX_WAITING = PeerLimits.waiting


@dataclass(frozen=True)
class HandedRegion:
    """A descriptor a client handed over, waiting for the REGISTER that names its token."""

    fd: int
    size: int
    dev: int
    ino: int
    uid: int
    expires: float
    pid: int = 0  # the process that handed it over (0: not visible from here)


def check_sealed(fd: int, max_bytes: int) -> os.stat_result:
    """Raise ``InvalidArgument`` unless ``fd`` is a sealed memory file of an acceptable size."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument("the descriptor is not a shared-memory segment")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if seals & (fcntl.F_SEAL_WRITE | _SEAL_FUTURE_WRITE):
        raise InvalidArgument("the segment is sealed against writing: outputs could not be written to it")
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise InvalidArgument(
            "the segment must be a memory file sealed against shrinking, growing and further seals "
            "(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): without F_SEAL_SEAL a write seal added later "
            "would fail the workers' mappings"
        )
    if st.st_size <= 0:
        raise InvalidArgument("the segment is empty")
    if max_bytes and st.st_size > max_bytes:
        raise ResourceExhausted(
            f"the segment's {st.st_size} bytes are over the {max_bytes} byte limit of one region "
            "(--max-region-bytes)"
        )
    return st


class _Conn(NamedTuple):
    sock: socket.socket
    until: float  # when to give up on it
    peer: tuple[int, int]  # (uid, pid)


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """``(uid, pid)`` of a Unix socket's peer (``SO_PEERCRED``, as it was when the peer connected)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, uid, _ = struct.unpack("3i", creds)
    return uid, pid


class _PeerCounts:
    """Counts of something held, in all, per uid and per pid, against a ceiling for each."""

    def __init__(self, total: int, per_uid: int, per_pid: int) -> None:
        self.limits = (total, per_uid, per_pid)
        self.total = 0
        self._uid: Counter[int] = Counter()
        self._pid: Counter[int] = Counter()

    def refusal(self, peer: tuple[int, int]) -> str | None:
        """The ceiling ``peer`` is at (``"all"``, ``"uid"``, ``"pid"``), or None if it may take one more."""
        total, per_uid, per_pid = self.limits
        uid, pid = peer
        if self._pid[pid] >= per_pid:
            return "pid"
        if self._uid[uid] >= per_uid:
            return "uid"
        if self.total >= total:
            return "all"
        return None

    def add(self, peer: tuple[int, int]) -> None:
        self.total += 1
        self._uid[peer[0]] += 1
        self._pid[peer[1]] += 1

    def remove(self, peer: tuple[int, int]) -> None:
        self.total -= 1
        for counts, key in ((self._uid, peer[0]), (self._pid, peer[1])):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]


class RegionIntake:
    """The hand-off socket. ``watch`` adds descriptors to the broker's poller; ``on_readable`` handles one."""

    def __init__(
        self,
        path: Path,
        max_region_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
        limits: PeerLimits = PeerLimits(),
    ) -> None:
        self.path = path
        self.max_region_bytes = max_region_bytes
        self.limits = limits
        self._clock = clock
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.setblocking(False)
        old = os.umask(0o177)
        try:
            self.sock.bind(os.fspath(path))
        finally:
            os.umask(old)
        self.sock.listen(BACKLOG)
        self._conns: dict[int, _Conn] = {}  # by descriptor
        self._conn_counts = _PeerCounts(limits.connections, limits.connections_per_uid,
                                        limits.connections_per_pid)  # fmt: skip
        self._waiting: dict[bytes, HandedRegion] = {}
        self._waiting_counts = _PeerCounts(limits.waiting, limits.waiting_per_uid, limits.waiting_per_pid)
        self._refused: Counter[str] = Counter()  # connections closed at once, by the ceiling reached
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
        for _ in range(256):  # bounded per turn: the rest wait in the backlog for the next one
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the client sees its connection closed
                log.warning("event=region_handoff_accept_failed error=%r", exc.strerror)
                return
            try:
                peer = peer_of(conn)
            except OSError:
                conn.close()
                continue
            over = self._conn_counts.refusal(peer)
            if over is not None:  # this peer (or everyone) holds its share: its own connection goes
                conn.close()
                self._refused[over] += 1  # counted, logged by ``expire``
                continue
            conn.setblocking(False)
            self._conns[conn.fileno()] = _Conn(conn, self._clock() + CONNECTION_TTL_S, peer)
            self._conn_counts.add(peer)
            if self._on_watch is not None:
                self._on_watch(conn.fileno(), True)

    def _close_conn(self, fd: int) -> None:
        conn = self._conns.pop(fd)
        self._conn_counts.remove(conn.peer)
        if self._on_watch is not None:
            self._on_watch(fd, False)
        conn.sock.close()

    def _receive(self, fd: int) -> None:
        conn = self._conns[fd]
        try:
            data, fds, flags, _ = socket.recv_fds(conn.sock, 64, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_conn(fd)
            return
        try:
            if not data and not fds:
                return  # the client went away
            reply = self._take(conn.peer, data, fds, flags)
            fds = []  # taken over (or closed) by _take
            conn.sock.send(reply)
        except OSError:
            pass
        finally:
            for extra in fds:
                os.close(extra)
            self._close_conn(fd)

    def _take(self, peer: tuple[int, int], data: bytes, fds: list[int], flags: int) -> bytes:
        """Check one datagram; its descriptor waits under its token. The reply for the client."""
        try:
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or len(fds) != 1:
                raise InvalidArgument("send exactly one descriptor with the token")
            if len(data) != len(MAGIC) + TOKEN_BYTES or not data.startswith(MAGIC):
                raise InvalidArgument("malformed hand-off message")
            token = data[len(MAGIC) :]
            if token in self._waiting:
                raise InvalidArgument("token already in use")
            over = self._waiting_counts.refusal(peer)
            if over is not None:
                limit = {"pid": self.limits.waiting_per_pid, "uid": self.limits.waiting_per_uid,
                         "all": self.limits.waiting}[over]  # fmt: skip
                who = {"pid": "this process has", "uid": "this user has", "all": "there are"}[over]
                raise ResourceExhausted(
                    f"too many segments are waiting for their REGISTER: {who} {limit} "
                    f"(each waits at most {TOKEN_TTL_S:g} s)"
                )
            st = check_sealed(fds[0], self.max_region_bytes)
        except (InvalidArgument, ResourceExhausted) as exc:
            for f in fds:
                os.close(f)
            log.info("event=region_handoff_refused uid=%d pid=%d error=%r", *peer, str(exc))
            return b"\x01" + str(exc).encode()
        except OSError as exc:
            for f in fds:
                os.close(f)
            reason = errno.errorcode.get(exc.errno or 0, "")
            return b"\x01" + f"cannot inspect the descriptor: {reason}".encode()
        uid, pid = peer
        self._waiting[token] = HandedRegion(fds[0], st.st_size, st.st_dev, st.st_ino, uid,
                                            self._clock() + TOKEN_TTL_S, pid)  # fmt: skip
        self._waiting_counts.add(peer)
        return b"\x00"

    def _unwait(self, token: bytes) -> HandedRegion:
        handed = self._waiting.pop(token)
        self._waiting_counts.remove((handed.uid, handed.pid))
        return handed

    def claim(self, token: object) -> HandedRegion:
        """The descriptor handed over under ``token`` (the caller owns it from now on)."""
        if not isinstance(token, bytes) or len(token) != TOKEN_BYTES:
            raise InvalidArgument("REGISTER needs the token of a segment handed over on the region socket")
        if token not in self._waiting:
            raise InvalidArgument("no segment was handed over under this token (or it expired)")
        return self._unwait(token)

    def expire(self) -> None:
        """Close descriptors nobody claimed and connections that sent nothing, past their time."""
        now = self._clock()
        for token in [t for t, h in self._waiting.items() if h.expires <= now]:
            os.close(self._unwait(token).fd)
        for fd in [fd for fd, conn in self._conns.items() if conn.until <= now]:
            self._close_conn(fd)
        if self._refused:
            counts = " ".join(f"per_{k}={v}" for k, v in sorted(self._refused.items()))
            log.warning("event=region_handoff_connections_refused %s", counts)
            self._refused.clear()

    def waiting(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        for fd in list(self._conns):
            self._close_conn(fd)
        for token in list(self._waiting):
            os.close(self._unwait(token).fd)
        self.sock.close()
        self.path.unlink(missing_ok=True)
