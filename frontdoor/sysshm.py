"""Triton's system shared memory extension: regions a caller on this host registers by ``/dev/shm`` key.

A registered key is hostile until checked, every time:

- the caller's uid is established by the kernel, never taken from the caller (``peer_uid``: SO_PEERCRED
  for a Unix socket, the peer socket's uid for loopback TCP); a caller whose uid cannot be established (a
  peer on another host, a gRPC Unix socket) may register only when the operator allowed it
  (``--allow-unknown-shm-callers``), and then only segments the front door's own user owns;
- the key is a plain ``/dev/shm`` name (``/name``, no other ``/``, no ``..``) and never one of zinfer's own
  (the reserved ``zinfer`` prefix: arenas, ensemble intermediates);
- it is opened with ``O_NOFOLLOW`` and must be a regular file owned by the caller (any owner for a root
  caller), so nobody reaches another user's memory through the front door;
- a region belongs to the uid that registered it: other callers can neither read nor write it in an
  inference, nor see it in a status, nor unregister it (root callers can); to them it does not exist;
- ``offset + byte_size`` must lie within the file at registration, and the file's identity (device, inode)
  and size are checked again at every use (``fstat``): tensors are copied through a mapping of the segment
  only by the compiled helper that turns a SIGBUS inside the copy into an error (``sysshm_maps``), else
  read with ``pread`` and written with ``pwrite`` on the descriptor, so a segment shrunk behind our back
  is an error, never the end of the process.

Registrations live in files of one folder (the server's runtime directory), so every front-door process
behind the shared port sees the same regions, as Triton's one process does. This first step copies bytes
between a region and the front door's own arena (one copy each way: ``pread`` straight into the arena
slot the broker's workers read); handing the caller's segment to the workers as a zinfer region would need
it sealed, which a Triton client's ``shm_open`` segment is not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client.errors import AlreadyExists, InvalidArgument, NotFound

from .copy_pool import CopyPool
from .errors import FrontDoorError
from .sysshm_caller import CallerShm
from .sysshm_maps import Copy, SegmentMaps

log = logging.getLogger(__name__)

__all__ = ["MAX_REGIONS", "CallerShm", "RegionStatus", "SystemShm"]

MAX_REGIONS = 1024
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
_RESERVED_PREFIX = "zinfer"
_SHM_DIR = Path("/dev/shm")
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_MAX_CACHED_FDS = 256
_UNKNOWN_UID = -1  # the owner recorded for a region a caller of unknown uid registered


@dataclass(frozen=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class _Record:
    name: str
    key: str
    offset: int
    byte_size: int
    dev: int
    ino: int
    uid: int = _UNKNOWN_UID  # the caller that registered it


def _not_found(name: str) -> NotFound:
    return NotFound(f"Unable to find system shared memory region: '{name}'")


def _owner(uid: int | None) -> int:
    return _UNKNOWN_UID if uid is None else uid


def _buffer_view(buf: Any, byte_size: int) -> memoryview:
    """``buf``'s bytes, which a read of ``byte_size`` bytes fills exactly."""
    view = _byte_view(buf)
    if len(view) != byte_size:
        raise InvalidArgument(f"a buffer of {len(view)} bytes cannot take {byte_size}")
    return view


def _output_view(data: Any, byte_size: int) -> memoryview:
    """An output's bytes, which must fit in the ``byte_size`` the request gave for it."""
    view = _byte_view(data)
    if len(view) > byte_size:
        raise InvalidArgument(
            f"shared memory size specified with the request for output is {byte_size} bytes, "
            f"the output needs {len(view)}"
        )
    return view


def _byte_view(data: Any) -> memoryview:
    """``data``'s bytes as a flat view (a C-contiguous buffer of any item type)."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _visible(record: _Record, uid: int | None) -> bool:
    """Whether the caller ``uid`` may use, see or unregister ``record``: its registrant, or root."""
    return uid == 0 or record.uid == _owner(uid)


class SystemShm:
    """The registry, shared by the front-door processes through ``folder`` (created 0700 if missing).

    Every operation names its caller's uid (None: unknown); ``allow_unknown`` lets callers of unknown uid
    register segments of the front door's own user (``--allow-unknown-shm-callers``)."""

    def __init__(self, folder: Path, shm_dir: Path = _SHM_DIR, *, allow_unknown: bool = False) -> None:
        self.folder = folder
        self.shm_dir = shm_dir
        self.allow_unknown = allow_unknown
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fds: dict[tuple[int, int], int] = {}  # (dev, ino) -> an open descriptor of that segment
        self._maps = SegmentMaps()  # (dev, ino) -> a mapping of that segment, where the helper is built
        # name -> (its registration file, that file's identity, the record read from it): one stat per use
        self._known: dict[str, tuple[str, tuple[int, int, int, int], _Record]] = {}
        self._lock = threading.Lock()
        self.copies = CopyPool()  # big copies off the event loop (``CallerShm``'s ``later``)

    def caller(
        self,
        uid: int | None = None,
        uid_of: Callable[[], int | None] | None = None,
        later: list[Callable[[], None]] | None = None,
    ) -> CallerShm:
        """The registry as one caller sees it (what the protocol layers pass around): its uid, or
        ``uid_of`` to ask for it when first needed; ``later`` collects its big copies, checked, for
        ``copies.run`` (None: every copy is made at once)."""
        return CallerShm(self, uid, uid_of, later)

    # ------------------------------------------------------------------------------------ registry

    def register(self, name: str, key: str, offset: int, byte_size: int, *, uid: int | None) -> None:
        if uid is None and not self.allow_unknown:
            raise FrontDoorError(
                "PERMISSION_DENIED",
                403,
                "system shared memory can be registered only by clients on this host whose user the server "
                "can establish (loopback TCP or a Unix socket); the server's --allow-unknown-shm-callers "
                "lets other clients register segments of the server's own user",
            )
        if not name or len(name) > 256:
            raise InvalidArgument("a shared memory region needs a name of 1 to 256 characters")
        if offset < 0 or byte_size < 0:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        if self._path(name).exists():
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(os.listdir(self.folder)) >= MAX_REGIONS:
            raise FrontDoorError("RESOURCE_EXHAUSTED", 429, f"at most {MAX_REGIONS} shared memory regions")
        fd = self._open(name, key)
        st = os.fstat(fd)
        allowed = os.getuid() if uid is None else uid
        if uid != 0 and st.st_uid != allowed:
            os.close(fd)
            log.warning(
                "event=system_shm_refused name=%r caller_uid=%s owner_uid=%d", name, uid, st.st_uid
            )
            raise FrontDoorError(
                "PERMISSION_DENIED",
                403,
                f"Unable to open shared memory region: '{key}': it belongs to another user (a client may "
                "register only segments its own user owns)",
            )
        if offset + byte_size > st.st_size:
            os.close(fd)
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        record = _Record(name, key, offset, byte_size, st.st_dev, st.st_ino, _owner(uid))
        self._keep(record, fd)  # held open while registered: the inode cannot be freed and reused
        if any(r.key == key for r in self._records()):
            self._close_unused()
            raise InvalidArgument(
                f'registering an active shared memory key, "{key}", under a different name is not '
                "currently supported"
            )
        tmp = self.folder / f".{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(asdict(record)), encoding="utf-8")
        try:
            os.link(tmp, self._path(name))  # fails if another process registered the name meanwhile
        except FileExistsError:
            self._close_unused()
            raise AlreadyExists(f"shared memory region '{name}' already in manager") from None
        finally:
            tmp.unlink(missing_ok=True)
        log.info("event=system_shm_registered name=%r byte_size=%d uid=%s", name, byte_size, uid)

    def unregister(self, name: str = "", *, uid: int | None) -> None:
        """Forget ``name`` (every region of the caller's when empty); unknown names, and other users'
        regions, are not an error (as in Triton)."""
        if name:
            try:
                records = [self._record(name, uid)]
            except NotFound:
                records = []
        else:
            records = [r for r in self._records() if _visible(r, uid)]
        for record in records:
            self._path(record.name).unlink(missing_ok=True)
        self._close_unused()

    def status(self, name: str = "", *, uid: int | None) -> tuple[RegionStatus, ...]:
        if name:
            r = self._record(name, uid)
            return (RegionStatus(r.name, r.key, r.offset, r.byte_size),)
        return tuple(
            RegionStatus(r.name, r.key, r.offset, r.byte_size)
            for r in sorted(self._records(), key=lambda r: r.name)
            if _visible(r, uid)
        )

    # ------------------------------------------------------------------------------------ tensors

    def read(
        self,
        name: str,
        offset: int,
        byte_size: int,
        out: npt.NDArray[Any] | None = None,
        *,
        uid: int | None,
    ) -> npt.NDArray[Any]:
        """``byte_size`` bytes at ``offset`` within the region, as uint8 (into ``out`` when given: a uint8
        array of that size, e.g. an arena slot)."""
        record = self._record(name, uid)
        fd, start = self._checked(record, offset, byte_size)
        buf = np.empty(byte_size, np.uint8) if out is None else out
        view = _buffer_view(buf, byte_size)
        if byte_size and not self._maps.read((record.dev, record.ino), fd, start, view):
            raise InvalidArgument(f"shared memory region '{name}' is smaller than registered")
        return buf

    def write(
        self, name: str, offset: int, byte_size: int, data: bytes | memoryview, *, uid: int | None
    ) -> None:
        """Write ``data`` at ``offset`` within the region; it must fit in ``byte_size``."""
        record = self._record(name, uid)
        view = _output_view(data, byte_size)
        fd, start = self._checked(record, offset, len(view))
        if len(view) and not self._maps.write((record.dev, record.ino), fd, start, view):
            raise InvalidArgument(f"shared memory region '{name}' is smaller than registered")

    def read_later(
        self, name: str, offset: int, byte_size: int, out: npt.NDArray[Any], *, uid: int | None
    ) -> Callable[[], None] | None:
        """``read`` into ``out`` checked now and copied by the returned call, on any thread (None: no
        mapping to copy through, ``read`` copies at once)."""
        record = self._record(name, uid)
        fd, start = self._checked(record, offset, byte_size)
        view = _buffer_view(out, byte_size)
        copy = self._maps.later_read((record.dev, record.ino), fd, start, view) if byte_size else None
        return None if copy is None else partial(_copied, copy, name)

    def write_later(
        self, name: str, offset: int, byte_size: int, data: bytes | memoryview, *, uid: int | None
    ) -> Callable[[], None] | None:
        """``write`` checked now and copied by the returned call, on any thread (None: as ``read_later``)."""
        record = self._record(name, uid)
        view = _output_view(data, byte_size)
        fd, start = self._checked(record, offset, len(view))
        copy = self._maps.later_write((record.dev, record.ino), fd, start, view) if len(view) else None
        return None if copy is None else partial(_copied, copy, name)

    # ------------------------------------------------------------------------------------ internals

    def _path(self, name: str) -> Path:
        return self.folder / hashlib.sha256(name.encode()).hexdigest()

    def _records(self) -> list[_Record]:
        found = []
        for path in self.folder.iterdir():
            if path.name.startswith("."):
                continue
            try:
                found.append(_Record(**json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):
                continue  # unregistered meanwhile
        return found

    def _record(self, name: str, uid: int | None) -> _Record:
        """The region ``name`` as the caller ``uid`` sees it: another user's region is not found. The
        registration file is read again only when its identity (device, inode, change time, size) is not
        the one last read: a region registered anew under the name is a new file (``register`` links it)."""
        if not name or len(name) > 256:
            raise _not_found(name[:256])
        known = self._known.get(name)
        path = known[0] if known is not None else str(self._path(name))
        try:
            st = os.stat(path)
        except OSError:
            raise _not_found(name) from None
        ident = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size)
        record: _Record | None = known[2] if known is not None and known[1] == ident else None
        if record is None:
            try:
                with open(path, encoding="utf-8") as f:
                    record = _Record(**json.loads(f.read()))
            except (OSError, ValueError, TypeError):
                raise _not_found(name) from None
            if len(self._known) >= MAX_REGIONS:
                self._known.clear()
            self._known[name] = (path, ident, record)
        if not _visible(record, uid):
            raise _not_found(name)
        return record

    def _open(self, name: str, key: str) -> int:
        bare = key[1:] if key.startswith("/") else key
        if not _KEY.fullmatch(key) or bare in (".", "..") or bare.startswith(_RESERVED_PREFIX):
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid key")
        try:
            fd = os.open(self.shm_dir / bare, _OPEN_FLAGS)
        except OSError:
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
        return fd

    def _checked(self, record: _Record, offset: int, nbytes: int) -> tuple[int, int]:
        """The descriptor of ``record``'s segment, still the one registered, and the file offset of
        ``offset``; the region (and the file, now: ``fstat``) must hold ``nbytes`` from there."""
        if offset < 0 or nbytes < 0 or offset + nbytes > record.byte_size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{record.name}'")
        fd = self._fd(record)
        if record.offset + offset + nbytes > os.fstat(fd).st_size:
            raise InvalidArgument(f"shared memory region '{record.name}' is smaller than registered")
        return fd, record.offset + offset

    def _fd(self, record: _Record) -> int:
        ident = (record.dev, record.ino)
        with self._lock:
            fd = self._fds.get(ident)
        if fd is not None:
            return fd
        fd = self._open(record.name, record.key)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != ident:  # the key names another segment than the one registered
            os.close(fd)
            raise InvalidArgument(f"shared memory region '{record.name}' changed since it was registered")
        self._keep(record, fd)
        return fd

    def _keep(self, record: _Record, fd: int) -> None:
        with self._lock:
            old = self._fds.pop((record.dev, record.ino), None)
            if old is not None:
                self._maps.drop((record.dev, record.ino))
                os.close(old)
            if len(self._fds) >= _MAX_CACHED_FDS:
                self._close_unused_locked(set())
            self._fds[(record.dev, record.ino)] = fd

    def _close_unused(self) -> None:
        live = {(r.dev, r.ino) for r in self._records()}
        with self._lock:
            self._close_unused_locked(live)

    def _close_unused_locked(self, live: set[tuple[int, int]]) -> None:
        for ident in [i for i in self._fds if i not in live]:
            self._maps.drop(ident)
            os.close(self._fds.pop(ident))

    def close(self) -> None:
        self.copies.close()
        with self._lock:
            self._close_unused_locked(set())


def _copied(copy: Copy, name: str) -> None:
    if not copy():
        raise InvalidArgument(f"shared memory region '{name}' is smaller than registered")
