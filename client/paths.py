"""Where a server keeps its sockets by default, shared by the server and its clients."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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
