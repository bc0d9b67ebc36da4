"""Issue 30, item 5: no region bigger than the machine can hold, and no user holding more than its share.

The attack: hand over a sparse memory file of 1 TiB (sealed as required) and fault pages into it through
requests: nothing bounded how much shared memory the server would hold for a client. Now a region may be
at most ``--max-region-bytes`` (default a quarter of physical memory) and one user's regions together at
most ``--max-user-region-bytes`` (default half of it), over all its connections; past either the newest
registration is refused with ``ResourceExhausted`` naming the limit.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

import pytest

from tests.conftest import MODELS, ServerProcess
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Command
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.shm import Segment

pytestmark = pytest.mark.integration

MIB = 1 << 20
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _sparse(size: int) -> int:
    fd = os.memfd_create("zinfer-csparse", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)  # no page is reserved: it costs nothing until pages are written
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def test_attack_region_size_a_1_tib_sparse_region_is_refused_by_default(
    bundled_server: ServerProcess,
) -> None:
    path = handoff_path(bundled_server.url)
    assert path is not None
    quarter = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    huge = _sparse(1 << 40)
    just = _sparse(quarter + 4096)
    try:
        for fd in (huge, just):
            with pytest.raises(InvalidArgument, match=f"over the {quarter} byte limit of one region"):
                hand_over(path, fd, 10.0)
    finally:
        os.close(huge)
        os.close(just)
    ok = Segment.create_sealed(MIB)  # an ordinary region is welcome
    raw = Raw(bundled_server.url)
    try:
        assert raw.register(ok).status == protocol.Status.OK
    finally:
        raw.close()
        ok.close()


def test_attack_region_size_one_users_regions_are_bounded_over_all_its_connections(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(
        MODELS, "--max-region-bytes", str(64 * MIB), "--max-user-region-bytes", str(160 * MIB)
    )
    path = handoff_path(server.url)
    assert path is not None
    first, second = Raw(server.url), Raw(server.url)
    fds = [_sparse(64 * MIB) for _ in range(3)] + [_sparse(64 * MIB + 1)]
    try:
        with pytest.raises(InvalidArgument, match=f"over the {64 * MIB} byte limit of one region"):
            hand_over(path, fds[3], 10.0)
        for i, (raw, fd) in enumerate(((first, fds[0]), (second, fds[1]))):
            token = hand_over(path, fd, 10.0)
            assert raw.call(Command.REGISTER, {"name": f"zinfer-cr{i}", "token": token}).status == 0
        token = hand_over(path, fds[2], 10.0)  # 192 MiB for this user: over its 160 MiB, on either connection
        reply = second.call(Command.REGISTER, {"name": "zinfer-cr2", "token": token})
        assert reply.status == protocol.Status.RESOURCE_EXHAUSTED
        assert f"over the {160 * MIB} byte limit of one user (--max-user-region-bytes)" in reply.error
        assert first.call(Command.UNREGISTER, {"name": "zinfer-cr0"}).status == 0  # room again
        token = hand_over(path, fds[2], 10.0)
        assert second.call(Command.REGISTER, {"name": "zinfer-cr2", "token": token}).status == 0
    finally:
        first.close()
        second.close()
        for fd in fds:
            os.close(fd)
