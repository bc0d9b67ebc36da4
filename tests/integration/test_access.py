"""Who may talk to the server: a private runtime directory, a shared group, loopback TCP, CURVE keys."""

from __future__ import annotations

import grp
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.conftest import MODELS, ServerProcess
from zinfer.client import Client, CurveKeys
from zinfer.client.errors import ConnectionFailed

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_runtime_dir_and_socket_are_private_by_default(server_factory: Callable[..., ServerProcess]) -> None:
    """Scenario 21: other users cannot reach the socket."""
    server = server_factory()
    assert _mode(server.runtime_dir) == 0o700
    assert _mode(server.runtime_dir / "zinfer.sock") == 0o600
    assert _mode(server.runtime_dir / "workers.sock") == 0o600


def test_socket_group_opens_it_to_a_group(server_factory: Callable[..., ServerProcess]) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    server = server_factory(MODELS, "--socket-group", group)
    assert _mode(server.runtime_dir) == 0o750
    assert _mode(server.runtime_dir / "zinfer.sock") == 0o660
    assert os.stat(server.runtime_dir / "zinfer.sock").st_gid == os.getgid()
    assert _mode(server.runtime_dir / "workers.sock") == 0o600  # workers' socket stays private


def test_non_loopback_tcp_without_curve_is_refused(tmp_path: Path) -> None:
    """Scenario 22: no open TCP port by accident."""
    done = subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics",
         "--runtime-dir", str(tmp_path / "rt"),
         "--tcp", f"0.0.0.0:{_free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2  # a configuration error
    assert "without CURVE" in done.stderr


def _keys(folder: Path, name: str) -> tuple[Path, Path]:
    subprocess.run([sys.executable, "-m", "zinfer.broker", "keys", str(folder), name], check=True, timeout=60,
                   capture_output=True)  # fmt: skip
    return folder / f"{name}.key", folder / f"{name}.key_secret"


def _non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine outside 127.0.0.0/8 (None if it has none)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


NON_LOOPBACK = _non_loopback_ipv4()


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        pytest.param(
            NON_LOOPBACK or "none",
            marks=pytest.mark.skipif(NON_LOOPBACK is None, reason="this machine has no non-loopback IPv4"),
            id="non-loopback",
        ),
    ],
)
def test_curve_admits_only_allowed_clients(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, host: str
) -> None:
    """Scenario 22: CURVE with an allow-list, on loopback and on an address other hosts could reach."""
    server_pub, server_sec = _keys(tmp_path / "server", "server")
    _, allowed_sec = _keys(tmp_path / "allowed", "alice")
    _, stranger_sec = _keys(tmp_path / "other", "mallory")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "alice.key").write_bytes((tmp_path / "allowed" / "alice.key").read_bytes())
    assert _mode(allowed_sec) == 0o600
    port = _free_port(host)
    server_factory(MODELS, "--tcp", f"{host}:{port}", "--curve-secret-key", str(server_sec),
                   "--curve-allow", str(allow))  # fmt: skip
    url = f"tcp://{host}:{port}"
    with Client(url, timeout=30, curve=CurveKeys.from_files(server_pub, allowed_sec)) as alice:
        assert alice.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0] == 2
    # refused at the handshake, they are never connected: nothing is sent, nothing waits for a reply
    with Client(url, timeout=1.0, curve=CurveKeys.from_files(server_pub, stranger_sec)) as mallory:
        with pytest.raises(ConnectionFailed, match="no connection"):
            mallory.is_server_live()
    with Client(url, timeout=1.0) as plain:
        with pytest.raises(ConnectionFailed, match="no connection"):
            plain.is_server_live()
