"""Issue 13, item 6: the runtime dir and the server socket are trusted only on $XDG_RUNTIME_DIR's terms.

A runtime dir the server did not make private (open to writes from others, owned by another user, or a
symbolic link) is refused as found; a client refuses a socket made by a user it does not trust.
"""

from __future__ import annotations

import asyncio
import grp
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from tests.conftest import MODELS, ServerProcess, start_server
from zinfer.client import AsyncClient, Client
from zinfer.client.errors import ConnectionFailed

pytestmark = pytest.mark.integration

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="changing a file's owner to another user needs root"
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _serve(runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics",
         "--model-repository", str(MODELS), "--runtime-dir", str(runtime_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_runtime_dir_writable_by_others_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    os.chmod(rt, 0o777)
    done = _serve(rt)
    assert done.returncode == 2, done.stderr
    assert "event=start_failed" in done.stderr and "writable by group or others" in done.stderr
    assert _mode(rt) == 0o777
    assert os.listdir(rt) == []  # no lock file, no socket


@needs_root
def test_runtime_dir_of_another_user_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    os.chown(rt, NOBODY, NOBODY)
    done = _serve(rt)
    assert done.returncode == 2, done.stderr
    assert f"owned by uid {NOBODY}" in done.stderr
    st = os.lstat(rt)
    assert (st.st_uid, st.st_gid, _mode(rt)) == (NOBODY, NOBODY, 0o700)
    assert os.listdir(rt) == []


def test_runtime_dir_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    os.chmod(target, 0o755)
    link = tmp_path / "rt"
    link.symlink_to(target)
    done = _serve(link)
    assert done.returncode == 2, done.stderr
    assert "is a symbolic link" in done.stderr
    assert _mode(target) == 0o755
    assert os.listdir(target) == []


def test_runtime_dir_created_private_and_accepted_again_after_socket_group(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A dir the server made (0700, parents as usual) and later shared (0750) is accepted at a restart."""
    group = grp.getgrgid(os.getgid()).gr_name
    (tmp_path / "a").mkdir()  # a/b, the folder above the runtime dir, is made by the server
    first = server_factory(MODELS, "--socket-group", group, runtime_dir=tmp_path / "a" / "b")
    assert _mode(first.runtime_dir) == 0o750
    assert first.stop() == 0
    second = server_factory(MODELS, "--socket-group", group, runtime_dir=tmp_path / "a" / "b")
    assert second.runtime_dir == first.runtime_dir
    with Client(second.url, timeout=30) as client:
        assert client.is_server_live()
    assert _mode(second.runtime_dir) == 0o750


def test_own_runtime_dir_readable_by_others_is_tightened(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    os.chmod(rt, 0o755)  # what systemd's RuntimeDirectory= makes
    server = start_server(MODELS, runtime_dir=tmp_path)
    try:
        assert _mode(rt) == 0o700
    finally:
        assert server.stop() == 0


@needs_root
def test_client_refuses_a_socket_of_another_user(server_factory: Callable[..., ServerProcess]) -> None:
    """Root chowns the server's socket to uid 65534: to a client it is now another user's socket."""
    server = server_factory()
    sock = server.runtime_dir / "zinfer.sock"
    os.chown(sock, NOBODY, -1)
    with Client(server.url, timeout=5) as client:
        with pytest.raises(ConnectionFailed, match=f"owned by uid {NOBODY}"):
            client.is_server_live()
    with Client(server.url, timeout=30, server_uid=NOBODY) as client:  # told to expect that user
        assert client.is_server_live()

    async def use_async(server_uid: int | None) -> bool:
        async with AsyncClient(server.url, timeout=30, server_uid=server_uid) as client:
            return await client.is_server_live()

    with pytest.raises(ConnectionFailed, match=f"owned by uid {NOBODY}"):
        asyncio.run(use_async(None))
    assert asyncio.run(use_async(NOBODY))


def test_client_refuses_a_symlinked_socket(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory()
    link = tmp_path / "zinfer.sock"
    link.symlink_to(server.runtime_dir / "zinfer.sock")
    with Client(f"ipc://{link}", timeout=5) as client:
        with pytest.raises(ConnectionFailed, match="symbolic link"):
            client.is_server_live()


def test_client_refuses_a_socket_in_a_folder_others_may_write(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        router.bind(f"ipc://{folder / 'zinfer.sock'}")
        with Client(f"ipc://{folder / 'zinfer.sock'}", timeout=5) as client:
            with pytest.raises(ConnectionFailed, match="writable by others"):
                client.is_server_live()
        assert not router.poll(100)  # nothing was sent
    finally:
        router.close(linger=0)
        ctx.term()
