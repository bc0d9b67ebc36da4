"""The front door's copies through mapped system shared memory (``sysshm_maps`` with the ``_shmcopy``
helper): the same bytes as ``pread``/``pwrite``, a mapping that follows the segment (grown, replaced,
unregistered), and a segment truncated under a copy is an error, never the end of the process.

The helper is a C module built by compiled installs; an editable install has none, so these tests build it
from frontdoor/_shmcopy.c with the C compiler (skipped where there is none)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.shmcopy_build import load_helper, shmcopy_helper
from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor import sysshm_maps
from zinfer.frontdoor.sysshm import SystemShm

ROOT = Path(__file__).resolve().parents[2]
ME = os.getuid()


@pytest.fixture(scope="module")
def helper_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The helper's shared library: the installed one, or one built here from the source."""
    path = shmcopy_helper(tmp_path_factory.mktemp("shmcopy"))
    if path is None:
        pytest.skip("no C compiler or Python headers to build frontdoor/_shmcopy.c")
    return path


@pytest.fixture
def helper(helper_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_helper(helper_path)
    monkeypatch.setattr(sysshm_maps, "_compiled", module)
    return module


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d


def _registry(tmp_path: Path, shm_dir: Path, helper: ModuleType | None) -> SystemShm:
    r = SystemShm(tmp_path / "registry", shm_dir)
    r._maps = sysshm_maps.SegmentMaps(helper)
    return r


def _segment(shm_dir: Path, size: int, name: str = "seg") -> Path:
    path = shm_dir / name
    path.write_bytes((bytes(range(256)) * (size // 256 + 1))[:size])
    return path


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "pread"])
def test_the_same_bytes_either_way(tmp_path: Path, shm_dir: Path, helper: ModuleType, mapped: bool) -> None:
    path = _segment(shm_dir, 4096)
    r = _registry(tmp_path, shm_dir, helper if mapped else None)
    try:
        r.register("r", "/seg", 1024, 2048, uid=ME)
        assert bytes(r.read("r", 0, 8, uid=ME)) == bytes(range(8))
        out = np.zeros(2, np.float32)  # any item type: its bytes
        r.read("r", 8, 8, out.view(np.uint8), uid=ME)
        assert out.tobytes() == bytes(range(8, 16))
        r.write("r", 100, 8, np.arange(2, dtype=np.float32).data, uid=ME)  # a float view: 8 bytes
        assert path.read_bytes()[1124:1132] == np.arange(2, dtype=np.float32).tobytes()
        assert (("mapped" if r._maps._maps else "pread") == "mapped") is mapped
    finally:
        r.close()


def test_the_mapping_follows_the_segment(tmp_path: Path, shm_dir: Path, helper: ModuleType) -> None:
    """Grown past the mapping: mapped again; replaced under the key and registered anew: the new file;
    unregistered: unmapped."""
    path = _segment(shm_dir, 256)
    r = _registry(tmp_path, shm_dir, helper)
    try:
        r.register("r", "/seg", 0, 64, uid=ME)
        assert bytes(r.read("r", 0, 4, uid=ME)) == bytes(range(4))
        r.unregister("r", uid=ME)
        assert not r._maps._maps  # closed with the descriptor
        os.truncate(path, 8192)
        with open(path, "r+b") as f:
            f.seek(4096)
            f.write(b"grown")
        r.register("r", "/seg", 4096, 64, uid=ME)
        assert bytes(r.read("r", 0, 5, uid=ME)) == b"grown"
        r.unregister("r", uid=ME)
        path.unlink()
        path.write_bytes(b"\x07" * 64)  # another file under the key
        r.register("r", "/seg", 0, 64, uid=ME)
        assert bytes(r.read("r", 0, 4, uid=ME)) == b"\x07" * 4
        r.write("r", 0, 4, b"new!", uid=ME)
        assert path.read_bytes()[:4] == b"new!"
    finally:
        r.close()


def test_a_segment_shrunk_after_it_was_mapped_is_an_error(
    tmp_path: Path, shm_dir: Path, helper: ModuleType
) -> None:
    path = _segment(shm_dir, 64 * 1024)
    r = _registry(tmp_path, shm_dir, helper)
    try:
        r.register("r", "/seg", 0, 64 * 1024, uid=ME)
        r.read("r", 0, 64 * 1024, uid=ME)  # mapped now
        os.truncate(path, 8192)
        with pytest.raises(InvalidArgument, match="smaller than registered"):
            r.read("r", 0, 64 * 1024, uid=ME)
        with pytest.raises(InvalidArgument, match="smaller than registered"):
            r.write("r", 0, 64 * 1024, b"x" * 64 * 1024, uid=ME)
        assert bytes(r.read("r", 0, 4, uid=ME)) == bytes(range(4))  # what is left still reads
    finally:
        r.close()


RACE = """
import faulthandler, importlib.util, os, sys, types
from pathlib import Path
import numpy as np
faulthandler.enable()  # installed before the helper's handler: a SIGBUS not caught would reach it
spec = importlib.util.spec_from_file_location("_shmcopy", sys.argv[1])
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)
from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor import sysshm, sysshm_maps
from zinfer.frontdoor.sysshm import SystemShm

folder, path = sys.argv[2], sys.argv[3]
r = SystemShm(Path(folder) / "registry", Path(path).parent)
r._maps = sysshm_maps.SegmentMaps(helper)
n = 1 << 20
r.register("r", "/" + os.path.basename(path), 0, n, uid=os.getuid())
r.read("r", 0, n, uid=os.getuid())  # mapped
real_fstat = os.fstat
class Stale:  # the size check sees the segment as it was: the truncation lands between check and copy
    def __init__(self, st): self.st_size, self.st_dev, self.st_ino = n, st.st_dev, st.st_ino
fake = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
fake.fstat = lambda fd: Stale(real_fstat(fd))
sysshm.os = fake
os.truncate(path, 4096)
for what in ("read", "write"):
    try:
        if what == "read":
            r.read("r", 0, n, uid=os.getuid())
        else:
            r.write("r", 0, n, b"y" * n, uid=os.getuid())
    except InvalidArgument as e:
        print(what, e)
print("alive")
"""


def test_a_truncation_between_the_check_and_the_copy_is_an_error_not_sigbus(
    tmp_path: Path, shm_dir: Path, helper_path: Path
) -> None:
    """Run in a process of its own: without the guard the copy would end it with SIGBUS."""
    path = _segment(shm_dir, 1 << 20)
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RACE), str(helper_path), str(tmp_path), str(path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines == [
        "read shared memory region 'r' is smaller than registered",
        "write shared memory region 'r' is smaller than registered",
        "alive",
    ], run.stdout + run.stderr


OTHER_SIGBUS = """
import faulthandler, importlib.util, mmap, os, signal, sys
if sys.argv[3] == "faulthandler":
    faulthandler.enable()
spec = importlib.util.spec_from_file_location("_shmcopy", sys.argv[1])
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)
assert helper.copy(bytearray(4), 0, b"abcd", 0, 4)  # the handler installed
if sys.argv[4] == "sent":
    os.kill(os.getpid(), signal.SIGBUS)
else:
    with open(sys.argv[2], "r+b") as f:
        m = mmap.mmap(f.fileno(), 1 << 16)
        os.ftruncate(f.fileno(), 0)
        print(m[40000])  # a fault outside any guarded copy
print("survived")
"""


@pytest.mark.parametrize("how", ["fault", "sent"])
@pytest.mark.parametrize("faulthandler", ["faulthandler", "plain"])
def test_a_sigbus_outside_a_guarded_copy_still_ends_the_process(
    tmp_path: Path, helper_path: Path, how: str, faulthandler: str
) -> None:
    """The helper's handler takes only faults inside its own copies: any other SIGBUS does what it did
    without the helper (faulthandler's report, then the default action)."""
    path = tmp_path / "seg"
    path.write_bytes(bytes(1 << 16))
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OTHER_SIGBUS), str(helper_path), str(path), faulthandler, how],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == -7, (run.returncode, run.stdout, run.stderr[-1000:])  # SIGBUS
    assert "survived" not in run.stdout
    assert ("Bus error" in run.stderr) is (faulthandler == "faulthandler")


def test_out_of_range_copies_are_refused_by_the_helper(helper: ModuleType) -> None:
    dst, src = bytearray(8), bytes(16)
    with pytest.raises(IndexError):
        helper.copy(dst, 1, src, 0, 8)
    with pytest.raises(IndexError):
        helper.copy(dst, 0, src, 12, 8)
    with pytest.raises(IndexError):
        helper.copy(dst, 0, src, 0, -1)
    with pytest.raises(TypeError):
        helper.copy(src, 0, dst, 0, 1)  # bytes are not writable
    assert helper.copy(dst, 0, b"abcdefgh", 0, 8) is True and dst == bytearray(b"abcdefgh")
