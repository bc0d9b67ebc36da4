"""Triton's system shared memory extension: regions a caller on this host registers by ``/dev/shm`` key.

A registered key is hostile until checked, every time:

- only callers on this host may register (the gRPC/HTTP layer passes ``local``): a remote caller cannot
  have created a segment here, and must not be able to name one of ours;
- the key is a plain ``/dev/shm`` name (``/name``, no other ``/``, no ``..``) and never one of zinfer's own
  (the reserved ``zinfer`` prefix: arenas, ensemble intermediates);
- it is opened with ``O_NOFOLLOW`` and must be a regular file owned by the front door's own uid, so a
  caller cannot reach another user's memory through the front door;
- ``offset + byte_size`` must lie within the file at registration, and the file's identity (device, inode)
  and size are checked again at every use: tensors are read with ``pread`` and written with ``pwrite`` on
  the descriptor, never through a mapping, so a segment shrunk behind our back is an error, not a SIGBUS.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from zinfer.client.errors import AlreadyExists, InvalidArgument, NotFound

from .errors import FrontDoorError

log = logging.getLogger(__name__)

__all__ = ["MAX_REGIONS", "RegionStatus", "SystemShm"]

MAX_REGIONS = 1024
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
_RESERVED_PREFIX = "zinfer"
_SHM_DIR = Path("/dev/shm")
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_MAX_CACHED_FDS = 256


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


def _not_found(name: str) -> NotFound:
    return NotFound(f"Unable to find system shared memory region: '{name}'")


class SystemShm:
    """The registry, shared by the front-door processes through ``folder`` (created 0700 if missing)."""

    def __init__(self, folder: Path, shm_dir: Path = _SHM_DIR) -> None:
        self.folder = folder
        self.shm_dir = shm_dir
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fds: dict[tuple[int, int], int] = {}  # (dev, ino) -> an open descriptor of that segment
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ registry

    def register(self, name: str, key: str, offset: int, byte_size: int, *, local: bool) -> None:
        if not local:
            raise FrontDoorError(
                "PERMISSION_DENIED",
                403,
                "system shared memory can be registered only by clients on this host",
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
        if offset + byte_size > st.st_size:
            os.close(fd)
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        record = _Record(name, key, offset, byte_size, st.st_dev, st.st_ino)
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
        log.info("event=system_shm_registered name=%r byte_size=%d", name, byte_size)

    def unregister(self, name: str = "") -> None:
        """Forget ``name`` (every region when empty); unknown names are not an error (as in Triton)."""
        paths = (
            [self._path(name)] if name else [p for p in self.folder.iterdir() if not p.name.startswith(".")]
        )
        for path in paths:
            path.unlink(missing_ok=True)
        self._close_unused()

    def status(self, name: str = "") -> tuple[RegionStatus, ...]:
        if name:
            r = self._record(name)
            return (RegionStatus(r.name, r.key, r.offset, r.byte_size),)
        return tuple(
            RegionStatus(r.name, r.key, r.offset, r.byte_size)
            for r in sorted(self._records(), key=lambda r: r.name)
        )

    # ------------------------------------------------------------------------------------ tensors

    def read(
        self, name: str, offset: int, byte_size: int, out: npt.NDArray[Any] | None = None
    ) -> npt.NDArray[Any]:
        """``byte_size`` bytes at ``offset`` within the region, as uint8 (into ``out`` when given: a uint8
        array of that size, e.g. an arena slot)."""
        record = self._record(name)
        fd, start = self._checked(record, offset, byte_size)
        buf = np.empty(byte_size, np.uint8) if out is None else out
        done = os.preadv(fd, [memoryview(buf)], start) if byte_size else 0  # type: ignore[arg-type]
        if done != byte_size:
            raise InvalidArgument(f"shared memory region '{name}' is smaller than registered")
        return buf

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` within the region; it must fit in ``byte_size``."""
        record = self._record(name)
        if len(data) > byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output is {byte_size} bytes, "
                f"the output needs {len(data)}"
            )
        fd, start = self._checked(record, offset, len(data))
        if data and os.pwrite(fd, data, start) != len(data):
            raise InvalidArgument(f"shared memory region '{name}' is smaller than registered")

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

    def _record(self, name: str) -> _Record:
        if not name or len(name) > 256:
            raise _not_found(name[:256])
        try:
            data: dict[str, Any] = json.loads(self._path(name).read_text(encoding="utf-8"))
            return _Record(**data)
        except FileNotFoundError:
            raise _not_found(name) from None
        except (OSError, ValueError, TypeError):
            raise _not_found(name) from None

    def _open(self, name: str, key: str) -> int:
        bare = key[1:] if key.startswith("/") else key
        if not _KEY.fullmatch(key) or bare in (".", "..") or bare.startswith(_RESERVED_PREFIX):
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid key")
        try:
            fd = os.open(self.shm_dir / bare, _OPEN_FLAGS)
        except OSError:
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
        return fd

    def _checked(self, record: _Record, offset: int, nbytes: int) -> tuple[int, int]:
        """The descriptor of ``record``'s segment, still the one registered, and the file offset of
        ``offset``; the region (and the file, now) must hold ``nbytes`` from there."""
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
            os.close(self._fds.pop(ident))

    def close(self) -> None:
        with self._lock:
            self._close_unused_locked(set())
