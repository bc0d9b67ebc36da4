"""``client/paths.check_server_socket``: a socket checked once is trusted again without its folder's stat
only while it is the very same file; a socket put in its place is checked in full."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from zinfer.client.errors import ConnectionFailed
from zinfer.client.paths import check_server_socket


def _bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def test_a_replaced_socket_is_checked_again_in_full(tmp_path: Path) -> None:
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o755)
    path = folder / "zinfer.sock"
    first = _bind(path)
    try:
        seen = check_server_socket(str(path))
        assert check_server_socket(str(path), None, seen) == seen
        os.chmod(folder, 0o777)  # now others could replace it: the same file is still the one checked
        assert check_server_socket(str(path), None, seen) == seen
        first.close()
        path.unlink()
        second = _bind(path)  # a new socket in a folder others may write to
        try:
            with pytest.raises(ConnectionFailed, match="writable by others"):
                check_server_socket(str(path), None, seen)
        finally:
            second.close()
    finally:
        first.close()


def test_a_socket_that_is_gone_is_reported_whatever_was_seen(tmp_path: Path) -> None:
    path = tmp_path / "zinfer.sock"
    s = _bind(path)
    seen = check_server_socket(str(path))
    s.close()
    path.unlink()
    with pytest.raises(ConnectionFailed, match="no zinfer server"):
        check_server_socket(str(path), None, seen)
