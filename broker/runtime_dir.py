"""The server's runtime directory: created private (0700), claimed with a lock so a second server on the
same directory refuses to start instead of stealing its sockets, and cleaned on exit.

A directory found already there is trusted only on ``$XDG_RUNTIME_DIR``'s terms: a real directory (not a
symbolic link) owned by the server's effective user and writable by nobody else. Anything else is refused
as found, never chmod'ed or chown'ed: whoever could write into it could have swapped the socket clients
connect to. A directory of ours that others may only read (0755, as systemd's ``RuntimeDirectory=``
makes it; 0750 after ``--socket-group``) is tightened to 0700.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
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
        """Create the folder (or check the one found), take the lock, and clear sockets a crashed server
        left behind. Raises ``ConfigError`` for a folder it must not trust."""
        dir_fd = self._open_private()
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(LOCK_NAME, flags, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(f"runtime dir {self.path}: {LOCK_NAME} is a symbolic link") from None
            raise
        finally:
            os.close(dir_fd)
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

    def _open_private(self) -> int:
        """A descriptor of the folder, created 0700 when missing, once it passes the ownership checks."""
        if not os.path.lexists(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                pass  # made meanwhile: checked below like any folder found
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(self.path):
                raise ConfigError(f"runtime dir {self.path} is a symbolic link: not followed") from None
            if exc.errno == errno.ENOTDIR:
                raise ConfigError(f"runtime dir {self.path} is not a directory") from None
            raise
        try:
            st = os.fstat(fd)
            problem = untrusted(st, os.geteuid())
            if problem:
                raise ConfigError(
                    f"runtime dir {self.path} {problem}: refusing to use it (remove it, or give a "
                    "--runtime-dir that is a directory of the server's user with mode 0700)"
                )
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)  # ours and closed to writes from others: only tightened
        except BaseException:
            os.close(fd)
            raise
        return fd

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


def untrusted(st: os.stat_result, uid: int) -> str:
    """Why a runtime dir with this ``stat`` may not serve user ``uid`` ("" when it may)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by the server's user (uid {uid})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {mode:04o})"
    return ""
