"""``Type=notify`` for real: a server whose ``NOTIFY_SOCKET`` is a datagram socket this test owns says
``READY=1`` only once its models are ready, pings ``WATCHDOG=1`` while it serves, and ``STOPPING=1`` on
SIGTERM. Both address kinds systemd uses are covered: a file path and the abstract namespace."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import MODELS
from zinfer.client import Client

pytestmark = pytest.mark.integration

LOAD_DELAY_S = 2.0
WATCHDOG_USEC = 400_000  # pings every 0.2 s

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

SLOW_MODEL = f"""
    import time

    class Model:
        def initialize(self, config):
            time.sleep({LOAD_DELAY_S})

        def execute(self, inputs):
            return {{"Y": inputs["X"]}}
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """``add``, and ``slow`` whose instance takes two seconds to load."""
    repo = tmp_path / "repo"
    shutil.copytree(MODELS / "add", repo / "add")
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(textwrap.dedent(SLOW_MODEL))
    return repo


@pytest.fixture(params=["path", "abstract"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """The service manager's end: a datagram socket, and the NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        value = str(tmp_path / "notify.sock")
        sock.bind(value)
    else:
        value = f"@zinfer-notify-test-{secrets.token_hex(6)}"
        sock.bind("\0" + value[1:])
    yield sock, value
    sock.close()


class Messages:
    """What arrived on the manager's socket, each with its arrival time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seen: list[tuple[float, str]] = []

    def until(self, predicate: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> float:
        """Receive until a message containing ``predicate`` arrives; its arrival time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(0.1)
            try:
                text = self.sock.recv(4096).decode()
            except TimeoutError:
                if proc.poll() is not None:
                    break
                continue
            now = time.monotonic()
            self.seen.append((now, text))
            if predicate in text.split("\n"):
                return now
        raise AssertionError(
            f"no {predicate!r} within {timeout}s; got {[m for _, m in self.seen]}\n{log.read_text()}"
        )

    def since(self, t: float) -> list[tuple[float, str]]:
        return [(at, m) for at, m in self.seen if at > t]


def _serve(repo: Path, runtime: Path, notify: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, NOTIFY_SOCKET=notify, WATCHDOG_USEC=str(WATCHDOG_USEC))
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics", "--model-repository", str(repo),
             "--runtime-dir", str(runtime)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def test_ready_after_the_models_then_watchdog_then_stopping(
    repository: Path, manager: tuple[socket.socket, str], tmp_path: Path
) -> None:
    sock, notify = manager
    log = tmp_path / "server.log"
    runtime = tmp_path / "rt"
    started = time.monotonic()
    proc = _serve(repository, runtime, notify, log)
    messages = Messages(sock)
    workers: list[psutil.Process] = []
    try:
        ready_at = messages.until("READY=1", 60, proc, log)
        # READY=1 is sent only after the broker logged readiness, and the slow model's instance came up
        text = log.read_text()
        assert "event=ready models=add:1,slow:1 failed=-" in text, text
        assert "event=instance_ready model=slow" in text, text
        assert ready_at - started >= LOAD_DELAY_S
        with Client(f"ipc://{runtime / 'zinfer.sock'}", timeout=30) as client:
            assert {r["name"]: r["state"] for r in client.repository_index()} == {"add": "READY",
                                                                                 "slow": "READY"}  # fmt: skip
        before = [m for _, m in messages.seen if m != "WATCHDOG=1"]
        assert any(m.startswith("STATUS=loading") and "slow" in m for m in before), before
        assert not any("READY=1" in m for m in before[:-1]), "READY=1 more than once"
        ready_message = before[-1]
        assert ready_message.startswith("READY=1\nSTATUS=serving 2 model(s)"), ready_message

        # workers are children of the broker but not of systemd's protocol: they inherit none of it
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers
        for worker in workers:
            assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(worker.environ())

        # the watchdog: pings about every WATCHDOG_USEC / 2 while serving; four in a row, each gap neither a
        # flood (well under the period) nor far past it (the upper bound leaves slack for a loaded CI machine)
        pings = [messages.until("WATCHDOG=1", 10, proc, log) for _ in range(4)]
        gaps = [b - a for a, b in zip(pings[:-1], pings[1:], strict=True)]
        period = WATCHDOG_USEC / 2e6
        assert all(period * 0.5 <= gap < 4 * period for gap in gaps), (gaps, period)

        # SIGTERM: STOPPING=1, then a clean exit; READY=1 never again
        proc.send_signal(signal.SIGTERM)
        stopping_at = messages.until("STOPPING=1", 20, proc, log)
        assert proc.wait(30) == 0, log.read_text()
        after = [m for at, m in messages.seen if at >= stopping_at]
        assert after[0].startswith("STOPPING=1\nSTATUS=draining"), after
        assert not any("READY=1" in m for _, m in messages.since(ready_at)), messages.seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        _, alive = psutil.wait_procs(workers, timeout=10)
        for p in alive:
            p.kill()


def test_a_server_that_cannot_start_never_says_ready(
    manager: tuple[socket.socket, str], tmp_path: Path
) -> None:
    sock, notify = manager
    log = tmp_path / "server.log"
    proc = _serve(tmp_path / "no-such-repository", tmp_path / "rt", notify, log)
    try:
        assert proc.wait(60) == 2, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    sock.setblocking(False)
    received = []
    while True:
        try:
            received.append(sock.recv(4096).decode())
        except BlockingIOError:
            break
    assert received and received[0].startswith("STATUS=model repository"), received
    assert not any("READY=1" in m for m in received)
