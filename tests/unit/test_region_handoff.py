"""Region hand-off (client and broker halves over a real Unix socket) and the worker's checked mappings."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from zinfer.broker.region_intake import PeerLimits, RegionIntake
from zinfer.client.errors import ConnectionFailed, InvalidArgument
from zinfer.client.protocol import ShmRef
from zinfer.client.region_handoff import MAGIC, hand_over
from zinfer.client.shm import Segment
from zinfer.workers.regions import RegionCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def intake(tmp_path: Path) -> Iterator[tuple[RegionIntake, Clock]]:
    """A hand-off socket served by a thread that polls it, as the broker loop does."""
    clock = Clock()
    it = RegionIntake(tmp_path / "regions.sock", max_region_bytes=1 << 20, clock=clock)
    watched: set[int] = set()
    it.watch(lambda fd, on: watched.add(fd) if on else watched.discard(fd))
    stop = threading.Event()
    # The broker calls on_readable and expire from its one loop; here a thread serves the socket, so the
    # two are serialised by a lock (an expire closing a connection the thread is reading raced before).
    lock = threading.Lock()
    expire = it.expire

    def locked_expire() -> None:
        with lock:
            expire()

    setattr(it, "expire", locked_expire)  # noqa: B010 - an instance attribute, for this fixture only

    def serve() -> None:
        import select

        while not stop.is_set():
            with lock:  # held through the select: expire waits at most 20 ms
                ready, _, _ = select.select(list(watched), [], [], 0.02)
                for fd in ready:
                    if fd in watched:
                        it.on_readable(fd)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield it, clock
    stop.set()
    t.join(5)
    it.close()


def test_a_sealed_segment_is_handed_over_and_claimed_once(intake: tuple[RegionIntake, Clock]) -> None:
    it, _ = intake
    seg = Segment.create_sealed(4096)
    try:
        token = hand_over(it.path, seg.fd, 5.0)
        handed = it.claim(token)
        st = os.fstat(seg.fd)
        assert (handed.dev, handed.ino, handed.size, handed.uid) == (st.st_dev, st.st_ino, 4096, os.getuid())
        assert handed.fd != seg.fd and os.fstat(handed.fd).st_ino == st.st_ino  # the server's own descriptor
        os.close(handed.fd)
        with pytest.raises(InvalidArgument, match="no segment"):
            it.claim(token)  # used once
    finally:
        seg.close()


def test_refusals(intake: tuple[RegionIntake, Clock]) -> None:
    it, _ = intake
    big = Segment.create_sealed(2 << 20)
    w = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    try:
        with pytest.raises(InvalidArgument, match="over the"):
            hand_over(it.path, big.fd, 5.0)
        os.ftruncate(w, 4096)
        import fcntl

        fcntl.fcntl(w, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
        with pytest.raises(InvalidArgument, match="sealed against writing"):
            hand_over(it.path, w, 5.0)
        with pytest.raises(InvalidArgument, match="token"):
            it.claim(b"short")
    finally:
        os.close(w)
        big.close()


def _handles(*segs: Segment) -> int:
    """How many descriptors this process holds on these segments' files (mappings hold one each too).
    Counting only them keeps unrelated descriptors (other tests' sockets being collected) out of the count."""
    inodes = {os.fstat(s.fd).st_ino for s in segs}
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{entry}").st_ino in inodes:
                count += 1
        except OSError:
            pass
    return count


def _send_raw(path: Path, data: bytes, fds: list[int]) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(5)
        s.connect(os.fspath(path))
        socket.send_fds(s, [data], fds)
        return s.recv(512)


def test_malformed_datagrams_are_answered_and_leak_no_descriptor(intake: tuple[RegionIntake, Clock]) -> None:
    it, _ = intake
    seg = Segment.create_sealed(4096)
    other = Segment.create_sealed(4096)
    try:
        before = _handles(seg, other)
        assert _send_raw(it.path, MAGIC + b"x" * 16, []).startswith(b"\x01")  # no descriptor
        assert _send_raw(it.path, MAGIC + b"x" * 16, [seg.fd, other.fd]).startswith(b"\x01")  # two
        assert _send_raw(it.path, b"HELLO" + b"x" * 16, [seg.fd]).startswith(b"\x01")  # bad magic
        assert _send_raw(it.path, MAGIC + b"x" * 3, [seg.fd]).startswith(b"\x01")  # short token
        assert _handles(seg, other) == before  # every refused descriptor was closed
    finally:
        other.close()
        seg.close()


def test_unclaimed_descriptors_expire_and_waiting_is_bounded(intake: tuple[RegionIntake, Clock]) -> None:
    it, clock = intake
    seg = Segment.create_sealed(4096)
    try:
        before = _handles(seg)
        per_pid = PeerLimits().waiting_per_pid  # this process's share
        tokens = [hand_over(it.path, seg.fd, 5.0) for _ in range(per_pid)]
        with pytest.raises(InvalidArgument, match=f"too many .* this process has {per_pid}"):
            hand_over(it.path, seg.fd, 5.0)
        assert _handles(seg) == before + per_pid and it.waiting() == per_pid
        clock.now += 60
        it.expire()
        assert _handles(seg) == before
        with pytest.raises(InvalidArgument, match="expired"):
            it.claim(tokens[0])
    finally:
        seg.close()


def test_no_server_is_connection_failed(tmp_path: Path) -> None:
    seg = Segment.create_sealed(4096)
    try:
        with pytest.raises(ConnectionFailed):
            hand_over(tmp_path / "nobody.sock", seg.fd, 1.0)
    finally:
        seg.close()


# ---------------------------------------------------------------------------------------------- worker side


def _wire(seg: Segment) -> tuple[int, tuple[int, int, int]]:
    """The broker's view: its own descriptor of the segment, and ``(fd, dev, ino)`` (as
    ``execute_from_wire`` gives the worker its table: tuples, which a compiled RegionCache insists on)."""
    fd = os.dup(seg.fd)
    st = os.fstat(fd)
    return fd, (fd, st.st_dev, st.st_ino)


def test_worker_maps_only_what_the_table_names_with_matching_identity() -> None:
    seg, again = Segment.create_sealed(4096), Segment.create_sealed(4096, name="zinfer-cx")
    seg_name = seg.name
    regions = RegionCache(owner=os.getpid())
    fds: list[int] = []
    try:
        np.frombuffer(seg.buf, np.float32, count=1)[0] = 1.0
        np.frombuffer(again.buf, np.float32, count=1)[0] = 2.0
        fd, wire = _wire(seg)
        fds.append(fd)
        regions.use_table({seg_name: wire})
        assert regions.bytes(ShmRef(seg_name, 0, 4)).view(np.float32)[0] == 1.0
        regions.use_table({})  # not in this batch's table: refused, even though it is still mapped
        with pytest.raises(InvalidArgument, match="not registered"):
            regions.bytes(ShmRef(seg_name, 0, 4))
        fd2, wire2 = _wire(again)  # the name registered again, for another file: never the old bytes
        fds.append(fd2)
        regions.use_table({seg_name: wire2})
        assert regions.bytes(ShmRef(seg_name, 0, 4)).view(np.float32)[0] == 2.0
        regions.use_table({seg_name: (fd2, wire2[1], wire2[2] + 1)})  # a descriptor of another file
        with pytest.raises(InvalidArgument, match="no longer registered"):
            regions.bytes(ShmRef(seg_name, 0, 4))
        regions.use_table({seg_name: wire2})
        with pytest.raises(InvalidArgument, match="outside"):
            regions.bytes(ShmRef(seg_name, 4090, 8))
        regions.use_table({seg_name: (1 << 20, 0, 0)})  # no such descriptor in the broker
        with pytest.raises(InvalidArgument, match="no longer registered"):
            regions.bytes(ShmRef(seg_name, 0, 4))
    finally:
        regions.close()
        for f in fds:
            os.close(f)
        seg.close()
        again.close()


def test_worker_mappings_are_bounded_least_recently_used_first() -> None:
    segs = [Segment.create_sealed(4096) for _ in range(6)]
    regions = RegionCache(owner=os.getpid(), max_mapped=3)
    wires = [_wire(s) for s in segs]
    try:
        table = {s.name: w for s, (_, w) in zip(segs, wires, strict=True)}
        regions.use_table(table)
        for s in segs:
            regions.bytes(ShmRef(s.name, 0, 4))
        assert regions.mapped() == 6  # within a batch nothing is unmapped
        regions.use_table(table)  # the next batch starts: back under the cap, oldest first
        assert regions.mapped() == 3
        before = _handles(segs[0])
        regions.bytes(ShmRef(segs[0].name, 0, 4))  # mapped again on use
        assert regions.mapped() == 4 and _handles(segs[0]) == before + 1  # one descriptor per mapping
    finally:
        regions.close()
        for fd, _ in wires:
            os.close(fd)
        for s in segs:
            s.close()


def _connect(it: RegionIntake, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        c = socket.socket(socket.AF_UNIX, it.sock.type)
        c.connect(str(it.path))
        out.append(c)
    return out


def _closed(clients: list[socket.socket]) -> list[bool]:
    """Which of the clients' connections the server closed (end of file), without waiting."""
    closed = []
    for c in clients:
        c.setblocking(False)
        try:
            closed.append(c.recv(1) == b"")
        except BlockingIOError:
            closed.append(False)
    return closed


@pytest.mark.parametrize(
    "limits, held",
    [
        (PeerLimits(connections=64, connections_per_uid=64, connections_per_pid=3), 3),  # the pid's share
        (PeerLimits(connections=64, connections_per_uid=4, connections_per_pid=16), 4),  # the uid's share
        (PeerLimits(connections=5, connections_per_uid=64, connections_per_pid=64), 5),  # everyone's
    ],
)
def test_hand_off_connections_are_held_up_to_each_ceiling(
    tmp_path: Path, limits: PeerLimits, held: int
) -> None:
    """Connections past a ceiling (this process's, its user's, everyone's) are closed at once, in the same
    turn of the accept loop; those before stay open; a connection's place frees when it closes."""
    it = RegionIntake(tmp_path / "r.sock", limits=limits)
    clients: list[socket.socket] = []
    try:
        clients += _connect(it, held + 2)
        it.on_readable(it.sock.fileno())
        assert len(it.fds()) - 1 == held  # the listening socket and the connections held
        assert _closed(clients) == [False] * held + [True, True]
        clients[0].close()  # one place frees when its client goes away
        it.on_readable(sorted(it.fds() - {it.sock.fileno()})[0])
        late = _connect(it, 1)
        clients += late
        it.on_readable(it.sock.fileno())
        assert len(it.fds()) - 1 == held and _closed(late) == [False]
    finally:
        for c in clients:
            c.close()
        it.close()


def test_a_connection_that_sends_nothing_is_closed_after_its_time(tmp_path: Path) -> None:
    from zinfer.broker.region_intake import CONNECTION_TTL_S

    clock = Clock()
    it = RegionIntake(tmp_path / "r.sock", clock=clock)
    clients = _connect(it, 2)
    try:
        it.on_readable(it.sock.fileno())
        clock.now += CONNECTION_TTL_S - 0.01
        it.expire()
        assert len(it.fds()) - 1 == 2
        clock.now += 0.02
        it.expire()
        assert len(it.fds()) - 1 == 0 and _closed(clients) == [True, True]
    finally:
        for c in clients:
            c.close()
        it.close()
