"""Big system shm copies off the front door's event loop (``CallerShm``'s ``later``, ``CopyPool``): every
check is made when the copy is asked for, the copy itself runs on the pool's threads and only there, with
the same bytes; small copies and installs without the mapped-copy helper copy at once; a region
unregistered or a segment truncated before its copy runs is an error, never another segment's bytes or
SIGBUS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.shmcopy_build import load_helper, shmcopy_helper
from zinfer.client.errors import InvalidArgument, NotFound
from zinfer.frontdoor import sysshm_maps
from zinfer.frontdoor.copy_pool import OFFLOAD_MIN_BYTES, CopyPool
from zinfer.frontdoor.sysshm import SystemShm

ROOT = Path(__file__).resolve().parents[2]
ME = os.getuid()
N = 1 << 20  # over OFFLOAD_MIN_BYTES


@pytest.fixture(scope="module")
def helper_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = shmcopy_helper(tmp_path_factory.mktemp("shmcopy"))
    if path is None:
        pytest.skip("no C compiler or Python headers to build frontdoor/_shmcopy.c")
    return path


@pytest.fixture
def helper(helper_path: Path) -> ModuleType:
    return load_helper(helper_path)


def _registry(tmp_path: Path, helper: ModuleType | None, size: int = 2 * N) -> SystemShm:
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir(parents=True)
    (shm_dir / "seg").write_bytes((bytes(range(251)) * (size // 251 + 1))[:size])
    r = SystemShm(tmp_path / "registry", shm_dir)
    r._maps = sysshm_maps.SegmentMaps(helper)
    r.register("r", "/seg", 0, size, uid=ME)
    return r


def _run(pool: CopyPool, later: list[Callable[[], None]]) -> set[int]:
    """Run ``later`` on ``pool`` from an event loop; the threads the copies ran on."""
    threads: set[int] = set()

    def traced(copy: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            threads.add(threading.get_ident())
            copy()

        return run

    later[:] = [traced(c) for c in later]
    asyncio.run(pool.run(later))
    assert later == []
    return threads


def test_a_big_copy_is_checked_at_once_and_made_on_the_pool(tmp_path: Path, helper: ModuleType) -> None:
    r = _registry(tmp_path, helper)
    seg = np.fromfile(tmp_path / "shm" / "seg", np.uint8)
    later: list[Callable[[], None]] = []
    caller = r.caller(ME, None, later)
    out = np.zeros(N, np.uint8)
    assert caller.read("r", 4096, N, out) is out
    assert len(later) == 1 and not out.any()  # not copied yet
    threads = _run(r.copies, later)
    assert threading.get_ident() not in threads and len(threads) == 1
    np.testing.assert_array_equal(out, seg[4096 : 4096 + N])
    data = np.full(N, 7, np.uint8)
    caller.write("r", N, N, memoryview(data))
    assert len(later) == 1 and not (np.fromfile(tmp_path / "shm" / "seg", np.uint8)[N:] == 7).all()
    assert threading.get_ident() not in _run(r.copies, later)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "shm" / "seg", np.uint8)[N:], data)
    r.close()


def test_small_copies_and_copies_without_the_helper_are_made_at_once(
    tmp_path: Path, helper: ModuleType
) -> None:
    r = _registry(tmp_path, helper)
    later: list[Callable[[], None]] = []
    caller = r.caller(ME, None, later)
    small = np.zeros(OFFLOAD_MIN_BYTES - 1, np.uint8)
    caller.read("r", 1, small.size, small)
    caller.write("r", 0, 16, b"x" * 16)
    assert later == [] and small[0] == 1 and (tmp_path / "shm" / "seg").read_bytes()[:16] == b"x" * 16
    r.close()
    plain = _registry(tmp_path / "plain", None)  # pread and pwrite: no mapping to hand to a thread
    caller = plain.caller(ME, None, later)
    out = np.zeros(N, np.uint8)
    caller.read("r", 0, N, out)
    caller.write("r", 0, N, memoryview(np.ones(N, np.uint8)))
    assert later == [] and out[1] == 1 and (tmp_path / "plain" / "shm" / "seg").read_bytes()[N - 1] == 1
    plain.close()


def test_every_check_is_made_when_the_copy_is_asked_for(tmp_path: Path, helper: ModuleType) -> None:
    r = _registry(tmp_path, helper)
    later: list[Callable[[], None]] = []
    caller = r.caller(ME, None, later)
    out = np.zeros(N, np.uint8)
    with pytest.raises(InvalidArgument, match="Invalid offset"):
        caller.read("r", N + 1, N, out)
    with pytest.raises(InvalidArgument, match="cannot take"):
        caller.read("r", 0, N, np.zeros(N + 1, np.uint8))
    with pytest.raises(NotFound):
        caller.read("other", 0, N, out)
    with pytest.raises(NotFound):  # another user's region does not exist for this caller
        r.caller(ME + 1, None, later).read("r", 0, N, out)
    with pytest.raises(InvalidArgument, match="the output needs"):
        caller.write("r", 0, N, memoryview(np.zeros(N + 1, np.uint8)))
    os.truncate(tmp_path / "shm" / "seg", N)
    with pytest.raises(InvalidArgument, match="smaller than registered"):
        caller.read("r", N, N, out)
    assert later == []
    r.close()


def test_a_region_unregistered_before_its_copy_runs_fails_that_copy(
    tmp_path: Path, helper: ModuleType
) -> None:
    r = _registry(tmp_path, helper)
    later: list[Callable[[], None]] = []
    caller = r.caller(ME, None, later)
    out = np.zeros(N, np.uint8)
    caller.read("r", 0, N, out)
    caller.write("r", N, N, memoryview(np.ones(N, np.uint8)))
    r.unregister("r", uid=ME)  # its mapping is closed: the copies must not reach it
    with pytest.raises(InvalidArgument, match="smaller than registered"):
        asyncio.run(r.copies.run(later))
    assert later == [] and not out.any()
    r.close()


def test_the_pool_raises_the_first_error_once_every_copy_ran() -> None:
    ran: list[int] = []

    def ok() -> None:
        ran.append(1)

    def bad() -> None:
        ran.append(2)
        raise InvalidArgument("bad")

    pool = CopyPool(2)
    with pytest.raises(InvalidArgument, match="bad"):
        asyncio.run(pool.run([bad, ok, ok]))
    assert sorted(ran) == [1, 1, 2]
    asyncio.run(pool.run([]))  # nothing to run: no thread needed
    pool.close()


TRUNCATED = """
import asyncio, faulthandler, importlib.util, os, sys
from pathlib import Path
import numpy as np
faulthandler.enable()  # a SIGBUS the guard did not catch would end the process here
spec = importlib.util.spec_from_file_location("_shmcopy", sys.argv[1])
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)
from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor import sysshm_maps
from zinfer.frontdoor.sysshm import SystemShm
folder, path = Path(sys.argv[2]), Path(sys.argv[3])
n = 1 << 20
r = SystemShm(folder / "registry", path.parent)
r._maps = sysshm_maps.SegmentMaps(helper)
r.register("r", "/" + path.name, 0, 2 * n, uid=os.getuid())
later = []
caller = r.caller(os.getuid(), None, later)
caller.read("r", n, n, np.zeros(n, np.uint8))
caller.write("r", n, n, memoryview(np.ones(n, np.uint8)))
os.truncate(path, 4096)  # after the checks, before the copies
for copy in later:
    try:
        asyncio.run(r.copies.run([copy]))
    except InvalidArgument as e:
        print(e)
print("alive")
"""


def test_a_segment_truncated_before_its_copy_runs_is_an_error_not_sigbus(
    tmp_path: Path, helper_path: Path
) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"\\1" * (2 * N))
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRUNCATED), str(helper_path), str(tmp_path), str(path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [
        "shared memory region 'r' is smaller than registered",
        "shared memory region 'r' is smaller than registered",
        "alive",
    ], run.stdout + run.stderr
