from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from zinfer.client import dtypes
from zinfer.client.arena import ALIGN, Arena
from zinfer.client.errors import InvalidArgument, ResourceExhausted, ShmError
from zinfer.client.shm import SHM_DIR, Segment, check_name, creator_pid


def test_segment_is_private_and_unlinked_by_owner() -> None:
    seg = Segment.create(4096)
    try:
        path = SHM_DIR / seg.name
        assert path.exists()
        assert path.stat().st_mode & 0o777 == 0o600
        assert creator_pid(seg.name) == os.getpid()
    finally:
        seg.close()
    assert not (SHM_DIR / seg.name).exists()


def test_client_segment_is_a_sealed_memory_file_with_no_name() -> None:
    """A client's segment cannot be listed, opened by name, shrunk or grown; it is gone with its last fd."""
    before = set(os.listdir(SHM_DIR))
    seg = Segment.create_sealed(8192)
    try:
        assert set(os.listdir(SHM_DIR)) == before  # nothing in /dev/shm to find or replace
        seals = fcntl.fcntl(seg.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, 64)
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, 1 << 20)
        seg.buf[:3] = b"abc"
        assert os.pread(seg.fd, 3, 0) == b"abc" and os.fstat(seg.fd).st_size == 8192
    finally:
        seg.close()
    assert seg.fd == -1


def test_attach_never_follows_a_symlink(tmp_path: Path) -> None:
    target = Segment.create(4096)
    link = SHM_DIR / f"zinfer-s{os.getpid()}-{os.urandom(8).hex()}"
    try:
        os.symlink(SHM_DIR / target.name, link)
        with pytest.raises(ShmError):
            Segment.attach(link.name)
    finally:
        link.unlink(missing_ok=True)
        target.close()


def test_attacher_exit_does_not_unlink() -> None:
    seg = Segment.create(4096)
    try:
        seg.buf[:5] = b"hello"
        code = textwrap.dedent(
            f"""
            from zinfer.client.shm import Segment
            s = Segment.attach({seg.name!r})
            assert bytes(s.buf[:5]) == b"hello"
            s.buf[:5] = b"HELLO"
            s.close()
            """
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
        assert (SHM_DIR / seg.name).exists()
        assert bytes(seg.buf[:5]) == b"HELLO"
    finally:
        seg.close()


@pytest.mark.parametrize("name", ["", "a/b", "../x", "zinfer-s123", "x" * 201, ".", "bad name"])
def test_check_name_rejects(name: str) -> None:
    with pytest.raises(ShmError):
        check_name(name)


def test_attach_of_missing_segment() -> None:
    with pytest.raises(ShmError):
        Segment.attach("zinfer-s1-0000000000000000")


def test_arena_alloc_free_coalesce_and_grow() -> None:
    created: list[str] = []
    arena = Arena(initial_bytes=1024, max_bytes=1 << 20, on_new_segment=lambda s: created.append(s.name))
    try:
        a = arena.alloc(100)
        b = arena.alloc(100)
        assert a.offset == 0 and b.offset == 128 and a.nbytes == 100
        arena.free(a)
        arena.free(b)
        c = arena.alloc(1024)  # coalesced back to one extent
        assert c.offset == 0 and len(created) == 1
        d = arena.alloc(10)  # full: grows
        assert len(created) == 2 and d.segment is not c.segment
        assert d.segment.size >= 2048
        d.view()[:3] = b"abc"
        assert bytes(d.segment.buf[d.offset : d.offset + 3]) == b"abc"
    finally:
        arena.close()
    assert not any((SHM_DIR / n).exists() for n in created)


def test_arena_limit() -> None:
    arena = Arena(initial_bytes=4096, max_bytes=8192)
    try:
        arena.alloc(4096)
        arena.alloc(4096)
        with pytest.raises(ResourceExhausted, match="arena limit"):
            arena.alloc(ALIGN)
    finally:
        arena.close()


def test_bytes_tensor_round_trip() -> None:
    arr = np.array([[b"ab", b""], [b"xyz", "é".encode()]], dtype=object)
    data = dtypes.serialize_bytes(arr)
    back = dtypes.deserialize_bytes(data, (2, 2))
    assert back.tolist() == arr.tolist()


@pytest.mark.parametrize(
    "data, shape, message",
    [
        (b"\x01\x00\x00", (1,), "shorter"),
        (b"\x05\x00\x00\x00ab", (1,), "runs past"),
        (b"\x01\x00\x00\x00ab", (1,), "left over"),
        (b"\xff\xff\xff\xff", (1,), "runs past"),
    ],
)
def test_bytes_tensor_rejects(data: bytes, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        dtypes.deserialize_bytes(data, shape)


def test_dtype_names() -> None:
    assert dtypes.config_to_wire("TYPE_FP32") == "FP32"
    assert dtypes.config_to_wire("TYPE_STRING") == "BYTES"
    assert dtypes.numpy_to_wire(np.float16) == "FP16"
    assert dtypes.numpy_to_wire(np.dtype(object)) == "BYTES"
    assert dtypes.wire_to_numpy("BF16").itemsize == 2
    assert len(dtypes.CONFIG_TYPES) == 14
    with pytest.raises(InvalidArgument):
        dtypes.numpy_to_wire(np.complex64)
    with pytest.raises(InvalidArgument):
        dtypes.wire_to_numpy("FP8")


def test_scenario_14_full_dev_shm_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """posix_fallocate reserves the pages up front, so a full /dev/shm is ENOSPC here, not a SIGBUS later.
    (The fault is injected: filling the real /dev/shm would take half the machine's memory.)"""
    import errno

    before = set(os.listdir(SHM_DIR))
    real = os.posix_fallocate

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(ShmError, match="/dev/shm is full"):
        Segment.create(1 << 20)
    with pytest.raises(ShmError, match="shared memory is full"):
        Segment.create_sealed(1 << 20)
    arena = Arena(initial_bytes=4096, max_bytes=1 << 20)
    try:
        with pytest.raises(ShmError, match="full"):
            arena.alloc(100)
        monkeypatch.setattr(os, "posix_fallocate", real)
        arena.alloc(100)  # the arena still works once there is room
    finally:
        arena.close()
    assert set(os.listdir(SHM_DIR)) == before  # nothing half-made left behind


def test_segment_for_a_group_is_0660() -> None:
    seg = Segment.create(4096, group=os.getgid())
    try:
        st = (SHM_DIR / seg.name).stat()
        assert st.st_mode & 0o777 == 0o660 and st.st_gid == os.getgid()
    finally:
        seg.close()
