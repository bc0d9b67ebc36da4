"""Shared-memory segments, created or attached without Python's resource tracker.

A client's segment is an anonymous, sealed memory file (``memfd_create`` with ``F_SEAL_SHRINK`` and
``F_SEAL_GROW``): it has no name in /dev/shm that another user could open, replace or list, it can never be
shrunk under a process that maps it (no SIGBUS), and it is freed when the last descriptor and mapping are
gone, so a dead client leaves nothing behind. The client hands its descriptor to the server over a Unix
socket (``region_handoff``); the ``name`` is only the label its descriptors refer to.

The server's own segments (ensemble intermediates, ``zinfer-s<pid>-<random>``) are named files in
/dev/shm, created 0600. Exactly one process creates a named segment and unlinks it; every other process only
attaches, through ``os.open`` (never following a symlink) and ``mmap`` rather than
``multiprocessing.shared_memory``, whose resource tracker (before Python 3.13) unlinks segments it merely
attached to.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import secrets
import stat
from pathlib import Path

from .errors import ShmError

SHM_DIR = Path("/dev/shm")
CLIENT_PREFIX = "zinfer-c"
"""Labels of client segments: ``zinfer-c<random>``."""
RESERVED_PREFIX = "zinfer-s"
"""Segments created by the server; a client may never register a name with this prefix."""
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def check_name(name: str) -> None:
    """Raise ``ShmError`` unless ``name`` is a plain segment name a client may register."""
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ShmError("region name must be 1-200 characters of letters, digits, '.', '_' or '-'")
    if name.startswith(RESERVED_PREFIX):
        raise ShmError("region name uses a prefix reserved for the server")


def new_client_name() -> str:
    return f"{CLIENT_PREFIX}{secrets.token_hex(16)}"


def new_server_name() -> str:
    """A segment name for the server's own memory (ensemble intermediates): ``zinfer-s<pid>-<random>``."""
    return f"{RESERVED_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"


def creator_pid(name: str) -> int | None:
    """The pid embedded in a server segment name, or None for other names."""
    m = re.fullmatch(rf"{RESERVED_PREFIX}(\d+)-[0-9a-f]{{16}}", name)
    return int(m.group(1)) if m else None


class Segment:
    """One mapped segment. ``owner`` segments are unlinked by ``close(unlink=True)``."""

    def __init__(
        self, name: str, fd: int, size: int, owner: bool, writable: bool = True, named: bool = True
    ) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self.named = named  # a file in /dev/shm (else an anonymous memory file)
        self._fd = fd
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.map: mmap.mmap | None = mmap.mmap(fd, size, access=access) if size > 0 else None
        self.buf = memoryview(self.map) if self.map is not None else memoryview(b"")

    @property
    def fd(self) -> int:
        """The segment's open descriptor (-1 once closed)."""
        return self._fd

    @classmethod
    def create_sealed(cls, size: int, name: str | None = None) -> Segment:
        """A client segment: an anonymous memory file of ``size`` bytes, pages reserved up front, sealed
        so that nobody can shrink or grow it (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``).

        Reserving with ``posix_fallocate`` turns a full memory budget into a clean ``ShmError`` here
        instead of a SIGBUS at first write.
        """
        if size <= 0:
            raise ShmError("segment size must be positive")
        name = name or new_client_name()
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise ShmError(f"cannot create shared-memory segment: {exc.strerror}") from None
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            return cls(name, fd, size, owner=True, named=False)
        except OSError as exc:
            os.close(fd)
            reason = "shared memory is full" if exc.errno == errno.ENOSPC else exc.strerror
            raise ShmError(f"cannot size shared-memory segment to {size} bytes: {reason}") from None

    @classmethod
    def from_fd(cls, name: str, fd: int, size: int, writable: bool = True) -> Segment:
        """Map an open descriptor of ``size`` bytes. The descriptor is closed once mapped: the mapping
        keeps the file alive (``mmap`` holds one descriptor of its own)."""
        try:
            seg = cls(name, fd, size, owner=False, writable=writable, named=False)
        finally:
            os.close(fd)
        seg._fd = -1
        return seg

    @classmethod
    def create(cls, size: int, name: str | None = None, group: int | None = None) -> Segment:
        """Create a segment of ``size`` bytes, mode 0600 (0660 for ``group``), its pages reserved up front.

        A server running as another user shares a group with its clients (its socket's group): giving the
        segment to that group lets its workers map it.

        Reserving with ``posix_fallocate`` turns a full ``/dev/shm`` into a clean ``ShmError`` here
        instead of a SIGBUS at first write.
        """
        if size <= 0:
            raise ShmError("segment size must be positive")
        name = name or new_server_name()
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ShmError(f"cannot create shared-memory segment: {exc.strerror}") from None
        try:
            if group is not None:
                os.fchown(fd, -1, group)
                os.fchmod(fd, 0o660)
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            reason = "/dev/shm is full" if exc.errno == errno.ENOSPC else exc.strerror
            raise ShmError(f"cannot size shared-memory segment to {size} bytes: {reason}") from None
        return cls(name, fd, size, owner=True)

    @classmethod
    def attach(cls, name: str, writable: bool = True) -> Segment:
        """Map an existing named segment without taking ownership (a symlink is never followed)."""
        try:
            flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(SHM_DIR / name, flags)
        except OSError as exc:
            raise ShmError(f"cannot open shared-memory region: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShmError("shared-memory region is not a regular segment")
            return cls(name, fd, st.st_size, owner=False, writable=writable)
        except BaseException:
            os.close(fd)
            raise

    def current_size(self) -> int:
        """The segment's size now (it may have been shrunk since it was mapped)."""
        return os.fstat(self._fd).st_size

    def close(self, unlink: bool | None = None) -> None:
        """Unmap and close; unlink when this process owns the segment (or when told to)."""
        if unlink is None:
            unlink = self.owner
        self.buf.release()
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                # A view still refers to the mapping; it is unmapped when the last view dies.
                pass
            self.map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if unlink and self.named:
            try:
                os.unlink(SHM_DIR / self.name)
            except FileNotFoundError:
                pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(names: list[str] | None = None) -> list[str]:
    """Unlink the server's own segments whose creating server is gone (after a crash); returns their names.

    Only names of the form ``zinfer-s<pid>-<random>`` are considered: client segments have no name to
    leave behind. The pid could in theory have been reused by another process, in which case the segment
    is kept (never the other way round).
    """
    if names is None:
        try:
            names = os.listdir(SHM_DIR)
        except OSError:
            return []
    reaped = []
    for name in names:
        pid = creator_pid(name)
        if pid is None or pid_alive(pid):
            continue
        try:
            os.unlink(SHM_DIR / name)
        except FileNotFoundError:
            pass
        reaped.append(name)
    return reaped
