"""Where a server keeps its sockets by default, shared by the server and its clients."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .errors import ConnectionFailed

SOCKET_NAME = "zinfer.sock"
WORKER_SOCKET_NAME = "workers.sock"
LOCK_NAME = "zinfer.lock"


def default_runtime_dir() -> Path:
    """``$ZINFER_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/zinfer``, else a per-user folder in the temp dir."""
    explicit = os.environ.get("ZINFER_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "zinfer"
    return Path(tempfile.gettempdir()) / f"zinfer-{os.getuid()}"


def client_endpoint(runtime_dir: Path) -> str:
    return f"ipc://{runtime_dir / SOCKET_NAME}"


def worker_endpoint(runtime_dir: Path) -> str:
    return f"ipc://{runtime_dir / WORKER_SOCKET_NAME}"


def default_url() -> str:
    return client_endpoint(default_runtime_dir())


SocketIdentity = tuple[int, int, int, int, int]
"""A file as ``check_server_socket`` found it: device, inode, mode, owner and change time."""


def check_server_socket(
    path: str, server_uid: int | None = None, seen: SocketIdentity | None = None
) -> SocketIdentity:
    """Raise ``ConnectionFailed`` unless ``path`` is a socket a server we trust made: owned by this process's
    user, by root, or by ``server_uid`` (a server running as its own user), in a folder nobody else may
    write to (or a sticky one, where nobody else may replace it). Checked with ``lstat``: a symbolic link
    is refused, whatever it points to. Returns the socket's identity: given back as ``seen``, a socket that
    is still that very file (same inode, mode, owner and change time: not replaced, not changed since) is
    trusted without its folder's ``stat``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConnectionFailed(f"no zinfer server at ipc://{path}") from None
    except OSError as exc:
        raise ConnectionFailed(f"cannot check the server socket ipc://{path}: {exc.strerror}") from None
    identity = (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_ctime_ns)
    if identity == seen:
        return identity
    trusted = {os.getuid(), os.geteuid(), 0} | ({server_uid} if server_uid is not None else set())
    if stat.S_ISLNK(st.st_mode):
        raise ConnectionFailed(f"refusing ipc://{path}: it is a symbolic link")
    if not stat.S_ISSOCK(st.st_mode):
        raise ConnectionFailed(f"refusing ipc://{path}: not a socket")
    if st.st_uid not in trusted:
        raise ConnectionFailed(
            f"refusing ipc://{path}: the socket is owned by uid {st.st_uid}, which is neither this user, "
            "root, nor the server_uid the client was given"
        )
    folder = os.stat(os.path.dirname(path) or ".")
    if folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not folder.st_mode & stat.S_ISVTX:
        raise ConnectionFailed(
            f"refusing ipc://{path}: its folder is writable by others, who could replace the socket"
        )
    return identity
