"""Issue 30, item 4: one peer of the region hand-off socket cannot lock the others out of registering.

The attack: open a couple of hundred ``SOCK_SEQPACKET`` connections to ``zinfer-regions.sock`` and send
nothing, and hand over hundreds of descriptors that are never claimed. Before the fix the socket held 64
connections and 256 waiting descriptors for everyone together, so for the 10 s of a token's life no other
client could register a region. Now each peer (its pid, and its uid, from ``SO_PEERCRED``) has its own
ceilings: the attacker exhausts its own share, and another process, of the same user or of another user,
registers at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import MODELS, ROOT, ServerProcess, read_line
from zinfer.client.errors import ConnectionFailed, InvalidArgument
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.shm import Segment

pytestmark = pytest.mark.integration

NOBODY = 65534

# A client that connects, waits for "go", then registers a segment (hand-off + REGISTER) and runs a request
# on it; it prints how long that took. With argv[2] == "nobody" it becomes uid/gid 65534 first.
VICTIM = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from zinfer.client.client import Client
    if sys.argv[2] == "nobody":  # after the imports: the interpreter's files may be root's alone
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
    with Client(sys.argv[1], timeout=30, inline_threshold=-1) as c:
        assert c.is_server_live()
        print("ready", flush=True)
        assert sys.stdin.readline().strip() == "go"
        t = time.monotonic()
        x = c.empty((1, 16), np.float32); x[:] = 3.0
        total = float(c.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0").sum())
        print("ok", round(time.monotonic() - t, 3), total, flush=True)
    """
)


def _victim(url: str, who: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", VICTIM, url, who], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def _end(proc: subprocess.Popen[str]) -> str:
    """Stop the process (if it still runs) and return what it wrote on stderr."""
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=10)
    return err


@pytest.fixture
def server(server_factory: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    """A server whose sockets uid 65534 may use too when the test runs as root (``--socket-group nogroup``,
    in a folder anyone may traverse; the factory removes it)."""
    base = Path(tempfile.mkdtemp(prefix="zi-"))
    os.chmod(base, 0o755)
    extra = ("--socket-group", "nogroup") if os.geteuid() == 0 else ()
    yield server_factory(MODELS, *extra, runtime_dir=base)


def _attack(path: Path, seg: Segment) -> tuple[list[socket.socket], int, list[str]]:
    """From this process: hand over descriptors never claimed until refused (10 refusals, 300 tries at most),
    then open 200 idle connections. Returns the idle connections, how many hand-offs the server kept, and
    its refusals."""
    kept, refusals = 0, []
    for _ in range(300):
        try:
            hand_over(path, seg.fd, 10.0)
            kept += 1
        except InvalidArgument as exc:
            refusals.append(str(exc))
            if len(refusals) >= 10:
                break
    idle = []
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(os.fspath(path))
        idle.append(s)
    return idle, kept, refusals


def _held(conns: list[socket.socket]) -> int:
    """How many of the connections the server still holds open (the others it closed: end of file)."""
    held = 0
    for c in conns:
        c.setblocking(False)
        try:
            c.recv(1)
        except BlockingIOError:
            held += 1
    return held


WHO = ["same-user"] + (["nobody"] if os.geteuid() == 0 else [])


def test_attack_handoff_starvation_one_peer_cannot_lock_others_out_of_registering(
    server: ServerProcess,
) -> None:
    path = handoff_path(server.url)
    assert path is not None
    victims = {who: _victim(server.url, who) for who in WHO}
    seg = Segment.create_sealed(4096)
    idle: list[socket.socket] = []
    try:
        for who, proc in victims.items():
            assert read_line(proc, 60) == "ready", f"{who}: {_end(proc)}"
        started = time.monotonic()
        idle, kept, refusals = _attack(path, seg)
        held = [len(idle)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the broker accepts the connections, and closes those it refuses
            time.sleep(0.05)
            held.append(_held(idle))
            if held[-1] == held[-2] < len(idle):
                break
        with pytest.raises((ConnectionFailed, InvalidArgument)):  # the attack is in place
            hand_over(path, seg.fd, 5.0)
        for proc in victims.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for who, proc in victims.items():
            line = read_line(proc, 30)
            assert line.startswith("ok "), f"{who} could not register: {line!r} {_end(proc)}"
            took, total = float(line.split()[1]), float(line.split()[2])
            assert total == 48.0 and took < 5.0, f"{who} took {took} s"  # 0.03 s measured
            assert proc.wait(30) == 0, f"{who}: {_end(proc)}"
        # the attack held all along: the attacker is still refused, well within a token's life (10 s)
        with pytest.raises((ConnectionFailed, InvalidArgument)):
            hand_over(path, seg.fd, 5.0)
        assert time.monotonic() - started < 10.0
        # and it was the attacker's own share that ran out, not everyone's
        from zinfer.broker.region_intake import PeerLimits

        limits = PeerLimits()
        assert kept == limits.waiting_per_pid and all("this process has" in r for r in refusals), refusals
        assert held[-1] == limits.connections_per_pid
    finally:
        for s in idle:
            s.close()
        seg.close()
        for proc in victims.values():
            _end(proc)
