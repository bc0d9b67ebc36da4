"""The server's runtime directory: created private (0700), claimed with a lock so a second server on the
same directory refuses to start instead of stealing its sockets, and cleaned on exit."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from zinfer.client.errors import ConfigError, ServerError, Status
from zinfer.client.paths import LOCK_NAME, SOCKET_NAME, WORKER_SOCKET_NAME


class AlreadyRunning(ServerError):
    status = Status.ALREADY_EXISTS


class RuntimeDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd = -1

    @property
    def held(self) -> bool:
        return self._lock_fd >= 0

    def claim(self) -> None:
        """Create the folder, take the lock, and clear sockets a crashed server left behind."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise AlreadyRunning(f"another zinfer server is running on {self.path}") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        for name in (SOCKET_NAME, WORKER_SOCKET_NAME):
            (self.path / name).unlink(missing_ok=True)

    def share_with_group(self, group: str) -> None:
        """Let members of ``group`` reach the client socket: folder 0750, socket 0660, both owned by it."""
        import grp

        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ConfigError(f"--socket-group: no group named {group!r}") from None
        os.chown(self.path, -1, gid)
        os.chmod(self.path, 0o750)
        os.chown(self.path / SOCKET_NAME, -1, gid)
        os.chmod(self.path / SOCKET_NAME, 0o660)

    def release(self) -> None:
        """Remove the sockets and the lock; only the server holding the lock owns them."""
        if not self.held:
            return
        for name in (SOCKET_NAME, WORKER_SOCKET_NAME, LOCK_NAME):
            (self.path / name).unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = -1
