"""A hostile local user against a live server's shared memory: every attack of issue 13 must fail.

Each test is named for the attack. A region is a sealed memory file whose descriptor its client handed over
(``client.region_handoff``); nothing here can be reached by a name or a path in /dev/shm.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.conftest import MODELS, ServerProcess, open_fds, read_line, wait_for
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Command
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.shm import SHM_DIR, Segment

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(bundled_server: ServerProcess) -> Iterator[Client]:
    with Client(bundled_server.url, timeout=30, inline_threshold=-1) as c:
        yield c


@pytest.fixture
def raw(bundled_server: ServerProcess) -> Iterator[Raw]:
    r = Raw(bundled_server.url)
    yield r
    r.close()


def _identity_header(region: str, offset: int, n: int, out_offset: int) -> dict[str, object]:
    """identity: ``n`` floats read at ``offset`` of ``region``, written back at ``out_offset``."""
    return {
        "model": "identity",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n], "shm": [region, offset, 4 * n]}],
        "outputs": [{"name": "OUTPUT0", "slot": [region, out_offset, 4 * n]}],
    }


def _still_serving(client: Client) -> None:
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)


# ---------------------------------------------------------------------------------------------- item 1


def test_attack_01_another_connections_region_cannot_be_registered_read_or_written(
    client: Client, raw: Raw
) -> None:
    secret = client.empty((1, 1024), np.float32)
    secret[:] = 42.0
    client.infer("identity", {"INPUT0": secret})  # the victim's arena is registered and in use
    assert client._arena is not None
    victim = client._arena.segments[0].name
    # by name alone: no descriptor was handed over, so there is nothing to claim
    reply = raw.call(Command.REGISTER, {"name": victim})
    assert reply.status == protocol.Status.INVALID_ARGUMENT and victim not in reply.error
    # the attacker's own segment under the victim's name: the name is taken by another connection
    mine = Segment.create_sealed(4096)
    try:
        reply = raw.register(mine, victim)
        assert reply.status == protocol.Status.ALREADY_EXISTS and victim not in reply.error
    finally:
        mine.close()
    # read through identity, write through an output slot: the region is not this connection's
    reply = raw.call(Command.INFER, _identity_header(victim, 0, 1024, 0))
    assert reply.status == protocol.Status.INVALID_ARGUMENT and "not registered" in reply.error
    assert float(secret.min()) == float(secret.max()) == 42.0
    _still_serving(client)


def test_attack_01_a_file_in_dev_shm_or_an_unsealed_memory_file_is_refused(raw: Raw) -> None:
    """Only a sealed memory file can be handed over: a /dev/shm file (even one's own) or an unsealed memfd
    could be shrunk or replaced under a worker."""
    path = handoff_path(raw.sock.getsockopt_string(zmq.LAST_ENDPOINT))
    assert path is not None
    named = Segment.create(4096)
    unsealed = os.memfd_create("zinfer-cunsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, 4096)
    try:
        for fd in (named.fd, unsealed):
            with pytest.raises(InvalidArgument, match="sealed against shrinking"):
                hand_over(path, fd, 10.0)
        with open(os.devnull, "rb") as f, pytest.raises(InvalidArgument, match="not a shared-memory segment"):
            hand_over(path, f.fileno(), 10.0)
    finally:
        os.close(unsealed)
        named.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_attack_01_tcp_connections_register_no_regions(server_factory: Callable[..., ServerProcess]) -> None:
    port = _free_port()
    server = server_factory(MODELS, "--tcp", f"127.0.0.1:{port}")
    path = handoff_path(server.url)
    assert path is not None
    seg = Segment.create_sealed(4096)
    remote = Raw(f"tcp://127.0.0.1:{port}")
    try:
        token = hand_over(path, seg.fd, 10.0)  # even with a valid token, a TCP connection may not claim it
        reply = remote.call(Command.REGISTER, {"name": seg.name, "token": token})
        assert reply.status == protocol.Status.INVALID_ARGUMENT
        assert "only over the local socket" in reply.error
    finally:
        remote.close()
        seg.close()


CROSS_USER = textwrap.dedent(
    """
    import os, sys
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    try:
        os.open("/dev/shm/" + sys.argv[1], os.O_RDWR)
    except PermissionError:
        print("refused")
    else:
        print("OPENED")
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another user (uid 65534)")
def test_attack_01_another_user_cannot_reach_a_root_segment(bundled_server: ServerProcess, raw: Raw) -> None:
    """uid 65534 cannot open a root 0600 segment, and without its descriptor it has nothing to register."""
    seg = Segment.create(4096)  # a root-owned 0600 segment of some other program
    try:
        seg.buf[:4] = b"root"
        out = subprocess.run([sys.executable, "-c", CROSS_USER, seg.name], capture_output=True, text=True,
                             timeout=30, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        assert out.stdout.strip() == "refused", out.stderr
        reply = raw.call(Command.REGISTER, {"name": seg.name})
        assert reply.status == protocol.Status.INVALID_ARGUMENT
        assert bytes(seg.buf[:4]) == b"root"
    finally:
        seg.close()


# ---------------------------------------------------------------------------------------------- item 2


def test_attack_02_a_symlink_under_a_regions_name_is_never_followed(
    client: Client, raw: Raw, tmp_path: Path
) -> None:
    seg = Segment.create_sealed(8192)
    target = tmp_path / "target"
    target.write_bytes(b"\x00" * 8192)
    link = SHM_DIR / seg.name
    try:
        assert raw.register(seg).status == protocol.Status.OK
        np.frombuffer(seg.buf, np.float32, count=4)[:] = [1, 2, 3, 4]
        os.symlink(target, link)  # the attacker plants the name in /dev/shm, pointing elsewhere
        reply = raw.call(Command.INFER, _identity_header(seg.name, 0, 4, 4096))
        assert reply.status == protocol.Status.OK, reply.error
        np.testing.assert_array_equal(np.frombuffer(seg.buf, np.float32, count=4, offset=4096), [1, 2, 3, 4])
        assert target.read_bytes() == b"\x00" * 8192  # the target was neither read into nor written
    finally:
        link.unlink(missing_ok=True)
        raw.call(Command.UNREGISTER, {"name": seg.name})
        seg.close()
    _still_serving(client)


# ---------------------------------------------------------------------------------------------- item 3

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def _punch(fd: int, size: int) -> None:
    _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(size))


def test_attack_03_shrinking_or_emptying_a_region_during_batches_crashes_nothing(
    bundled_server: ServerProcess, client: Client
) -> None:
    """Shrinking is impossible (sealed); punching holes frees pages, which read back as zeros: every
    request completes, the worker is the same process, the broker serves on."""
    n = 4 << 20  # 16 MiB of fp32 in, 16 MiB out
    worker = next(p for p in bundled_server.workers() if "identity" in " ".join(p.cmdline()))
    with Client(bundled_server.url, timeout=30, inline_threshold=-1) as victim:
        x = victim.empty((1, n), np.float32)
        x[:] = 1.0
        victim.infer("identity", {"INPUT0": x})
        assert victim._arena is not None
        fd = victim._arena.segments[0].fd
        size = victim._arena.segments[0].size
        stop = threading.Event()
        refused: list[int] = []

        def attack() -> None:
            while not stop.is_set():
                try:
                    os.ftruncate(fd, 4096)
                except PermissionError:
                    refused.append(1)
                _punch(fd, size)

        t = threading.Thread(target=attack)
        t.start()
        try:
            deadline = time.monotonic() + 3.0
            done = 0
            while time.monotonic() < deadline and done < 40:
                out = victim.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
                assert out.shape == (1, n) and set(np.unique(out)) <= {0.0, 1.0}
                done += 1
        finally:
            stop.set()
            t.join(10)
        assert done > 0 and refused
    assert worker.is_running() and worker.status() != "zombie"
    _still_serving(client)


# ---------------------------------------------------------------------------------------------- item 4


def test_attack_04_a_region_registered_again_never_serves_the_old_bytes(client: Client, raw: Raw) -> None:
    old = Segment.create_sealed(8192)
    new = Segment.create_sealed(8192, name=old.name)  # "recreated under the same name"
    try:
        np.frombuffer(old.buf, np.float32, count=4)[:] = 1.0
        np.frombuffer(new.buf, np.float32, count=4)[:] = 5.0
        assert raw.register(old).status == protocol.Status.OK
        assert raw.call(Command.INFER, _identity_header(old.name, 0, 4, 4096)).status == protocol.Status.OK
        np.testing.assert_array_equal(np.frombuffer(old.buf, np.float32, count=4, offset=4096), 1.0)
        old.close()  # the client drops the old one and registers the new one under the same name
        assert raw.register(new).status == protocol.Status.OK
        reply = raw.call(Command.INFER, _identity_header(new.name, 0, 4, 4096))
        assert reply.status == protocol.Status.OK, reply.error
        np.testing.assert_array_equal(np.frombuffer(new.buf, np.float32, count=4, offset=4096), 5.0)
    finally:
        raw.call(Command.UNREGISTER, {"name": new.name})
        new.close()
        old.close()
    _still_serving(client)


# ---------------------------------------------------------------------------------------------- item 5


def test_attack_05_registering_many_regions_exhausts_nothing_for_others(
    bundled_server: ServerProcess,
) -> None:
    broker = bundled_server.proc.pid
    worker = next(p for p in bundled_server.workers() if "identity" in " ".join(p.cmdline()))
    before = open_fds(broker)
    attacker = Raw(bundled_server.url)
    segs: list[Segment] = []
    try:
        refused = None
        for _ in range(400):
            seg = Segment.create_sealed(4096)
            segs.append(seg)
            reply = attacker.register(seg)
            if reply.status != protocol.Status.OK:
                refused = reply
                break
            seg.close()  # the server's descriptor keeps it alive; the attacker keeps nothing
            reply = attacker.call(Command.INFER, _identity_header(seg.name, 0, 4, 64))  # the worker maps it
            assert reply.status == protocol.Status.OK, reply.error
        assert refused is not None and refused.status == protocol.Status.RESOURCE_EXHAUSTED
        assert "at most" in refused.error
        assert open_fds(worker.pid) < 600  # one descriptor per mapping, bounded
        with Client(bundled_server.url, timeout=30, inline_threshold=-1) as other:  # a new client is fine
            _still_serving(other)
    finally:
        attacker.close()
        for seg in segs:
            seg.close()
    # the attacker's connection is gone: its regions are released, judged by the connection
    wait_for(lambda: open_fds(broker) <= before + 8, 15.0, "the broker to release the attacker's regions")


# ---------------------------------------------------------------------------------------------- item 7

PID_NS_CLIENT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from zinfer.client.client import Client
    with Client(sys.argv[1], timeout=30, inline_threshold=-1) as c:
        registered = []  # the client registers its regions again if the server forgot them: count that
        register_all = c._register_all
        c._register_all = lambda: (registered.append(1), register_all())[1]
        x = c.empty((1, 16), np.float32); x[:] = 3.0
        assert c.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0").sum() == 48.0
        print("registered", flush=True)
        assert sys.stdin.readline().strip() == "go"  # the test saw a reap pass run since
        assert c.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0").sum() == 48.0
    print("ok", len(registered), flush=True)
    """
)

KILLED_CLIENT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from zinfer.client.client import Client
    c = Client(sys.argv[1], timeout=30, inline_threshold=-1)
    x = c.empty((1, 1 << 20), np.float32); x[:] = 1.0
    c.infer("identity", {"INPUT0": x})
    print("registered", flush=True)
    time.sleep(60)  # holds its regions until the test kills it (a bound, should the test die first)
    """
)


UNSHARE = ("unshare", "--pid", "--fork", "--kill-child")  # a PID namespace of its own, ended with us


def _can_unshare_pid() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def _client(script: str, url: str, *prefix: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, sys.executable, "-c", script, url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def _line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The next line the process prints, or an assertion error after ``timeout`` seconds."""
    line = read_line(proc, timeout)
    assert line, f"no line from pid {proc.pid} within {timeout} s"
    return line


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


@pytest.mark.skipif(not _can_unshare_pid(), reason="needs root and unshare(1) to start a PID namespace")
def test_attack_07_a_client_in_another_pid_namespace_keeps_its_regions(bundled_server: ServerProcess) -> None:
    """A live client whose pid the server cannot see keeps its regions through a reap pass: the pass that
    released a killed witness's regions also probed this client, and its next call needs no registration
    (a client whose regions were dropped registers them again, so success alone would prove nothing)."""
    reaped = "event=regions_reaped reason=connection_gone"
    inside = _client(PID_NS_CLIENT, bundled_server.url, *UNSHARE)
    try:
        assert _line(inside) == "registered"
        passes = bundled_server.log().count(reaped)
        witness = _client(KILLED_CLIENT, bundled_server.url)
        try:
            assert _line(witness) == "registered"
        finally:
            _end(witness)
        wait_for(lambda: bundled_server.log().count(reaped) > passes, 15.0, "a reap pass after the witness")
        assert inside.stdin is not None
        inside.stdin.write("go\n")
        inside.stdin.flush()
        assert _line(inside) == "ok 0", "the server dropped the live client's regions"
        assert inside.wait(30) == 0
    finally:
        _end(inside)


def test_attack_07_a_killed_clients_regions_are_released_by_its_connection(
    bundled_server: ServerProcess,
) -> None:
    broker = bundled_server.proc.pid
    before = open_fds(broker)
    proc = _client(KILLED_CLIENT, bundled_server.url)
    try:
        assert _line(proc) == "registered"
        assert open_fds(broker) > before
    finally:
        _end(proc)
    wait_for(lambda: open_fds(broker) <= before, 10.0, "the broker to release a dead client's regions")
