"""Triton's system shared memory registry of the front door, on real files: what a caller may name, and
that every use checks again (identity, size). test_frontdoor_sysshm_maps.py: the copies through a mapping."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from zinfer.client.errors import AlreadyExists, InvalidArgument, NotFound
from zinfer.frontdoor.errors import FrontDoorError, triton_error
from zinfer.frontdoor.sysshm import SystemShm

ME = os.getuid()


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d


@pytest.fixture
def registry(tmp_path: Path, shm_dir: Path) -> Iterator[SystemShm]:
    r = SystemShm(tmp_path / "registry", shm_dir)
    yield r
    r.close()


def _segment(shm_dir: Path, size: int, name: str = "seg") -> Path:
    path = shm_dir / name
    path.write_bytes((bytes(range(256)) * (size // 256 + 1))[:size])
    return path


def test_round_trip_and_every_process_sees_the_registration(
    tmp_path: Path, shm_dir: Path, registry: SystemShm
) -> None:
    _segment(shm_dir, 1024)
    registry.register("r", "/seg", 256, 512, uid=ME)
    other = SystemShm(tmp_path / "registry", shm_dir)  # another front-door process
    try:
        regions = [(s.name, s.key, s.offset, s.byte_size) for s in other.status(uid=ME)]
        assert regions == [("r", "/seg", 256, 512)]
        assert other.read("r", 0, 4, uid=ME).tolist() == [
            0,
            1,
            2,
            3,
        ]  # file byte 256 is 0 again
        registry.write("r", 8, 8, b"abcdefgh", uid=ME)
        assert bytes(other.read("r", 8, 8, uid=ME)) == b"abcdefgh"
        out = np.zeros(4, np.uint8)
        assert other.read("r", 8, 4, out, uid=ME) is out and bytes(out) == b"abcd"
        other.unregister("r", uid=ME)
        with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
            registry.read("r", 0, 4, uid=ME)
    finally:
        other.close()


def test_a_name_registered_anew_elsewhere_is_read_anew(
    tmp_path: Path, shm_dir: Path, registry: SystemShm
) -> None:
    """A process keeps what it read of a registration only while that file is the one registered: a name
    unregistered and registered again by another front-door process (another segment, offset, size) is
    seen as it is now, and one unregistered is gone."""
    _segment(shm_dir, 64, "seg1")
    (shm_dir / "seg2").write_bytes(b"\xaa" * 16 + b"\xbb" * 48)
    registry.register("r", "/seg1", 0, 64, uid=ME)
    other = SystemShm(tmp_path / "registry", shm_dir)  # another front-door process
    try:
        assert other.read("r", 0, 4, uid=ME).tolist() == [0, 1, 2, 3]
        registry.unregister("r", uid=ME)
        registry.register("r", "/seg2", 16, 32, uid=ME)
        assert bytes(other.read("r", 0, 4, uid=ME)) == b"\xbb" * 4
        assert [(s.key, s.offset, s.byte_size) for s in other.status("r", uid=ME)] == [("/seg2", 16, 32)]
        with pytest.raises(InvalidArgument, match="Invalid offset"):
            other.read("r", 0, 33, uid=ME)
        registry.unregister("r", uid=ME)
        with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
            other.read("r", 0, 4, uid=ME)
    finally:
        other.close()


def test_a_caller_of_unknown_uid_may_not_register_by_default(shm_dir: Path, registry: SystemShm) -> None:
    _segment(shm_dir, 64)
    with pytest.raises(FrontDoorError) as err:
        registry.register("r", "/seg", 0, 64, uid=None)
    assert triton_error(err.value).grpc_code == "PERMISSION_DENIED"
    assert registry.status(uid=ME) == ()


@pytest.mark.parametrize(
    "key", ["/../etc/passwd", "/a/b", "..", "/zinfer-arena-1", "zinferx", "", "/" + "a" * 201]
)
def test_keys_outside_plain_names_or_zinfers_own_are_refused(
    shm_dir: Path, registry: SystemShm, key: str
) -> None:
    with pytest.raises(InvalidArgument):
        registry.register("r", key, 0, 0, uid=ME)


def test_a_symlink_is_not_followed(tmp_path: Path, shm_dir: Path, registry: SystemShm) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 64)
    (shm_dir / "link").symlink_to(secret)
    with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
        registry.register("r", "/link", 0, 64, uid=ME)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_caller_registers_only_its_own_segments_and_root_any(shm_dir: Path, registry: SystemShm) -> None:
    path = _segment(shm_dir, 64)
    os.chown(path, 65534, 65534)
    with pytest.raises(FrontDoorError, match="belongs to another user") as err:
        registry.register("r", "/seg", 0, 64, uid=1000)
    assert triton_error(err.value).grpc_code == "PERMISSION_DENIED"
    assert registry.status(uid=0) == ()
    registry.register("mine", "/seg", 0, 64, uid=65534)
    registry.unregister(uid=65534)
    registry.register("roots", "/seg", 0, 64, uid=0)  # root may register anyone's


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_region_is_its_registrants_alone(shm_dir: Path, registry: SystemShm) -> None:
    """Another user can neither read, write, see nor unregister it: to them it does not exist."""
    path = _segment(shm_dir, 64)
    os.chown(path, 65534, 65534)
    registry.register("r", "/seg", 0, 64, uid=65534)
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
        registry.read("r", 0, 8, uid=1000)
    with pytest.raises(NotFound):
        registry.write("r", 0, 8, b"x" * 8, uid=1000)
    with pytest.raises(NotFound):
        registry.status("r", uid=1000)
    assert registry.status(uid=1000) == ()
    registry.unregister("r", uid=1000)
    registry.unregister(uid=1000)
    assert [s.name for s in registry.status(uid=65534)] == ["r"]
    assert registry.read("r", 0, 4, uid=65534).tolist() == [0, 1, 2, 3]
    assert [s.name for s in registry.status(uid=0)] == ["r"]  # root sees (and may use) every region
    registry.unregister("r", uid=0)
    assert registry.status(uid=65534) == ()


def test_callers_of_unknown_uid_need_the_operators_consent(tmp_path: Path, shm_dir: Path) -> None:
    _segment(shm_dir, 64)
    allowing = SystemShm(tmp_path / "registry", shm_dir, allow_unknown=True)
    try:
        allowing.register("r", "/seg", 0, 64, uid=None)  # the front door's own user owns it
        assert allowing.read("r", 0, 2, uid=None).tolist() == [0, 1]
        with pytest.raises(NotFound):
            allowing.read("r", 0, 2, uid=ME + 1)
        if ME == 0:
            os.chown(shm_dir / "seg", 65534, 65534)
            allowing.unregister(uid=None)
            with pytest.raises(FrontDoorError, match="belongs to another user"):
                allowing.register("r", "/seg", 0, 64, uid=None)
    finally:
        allowing.close()


def test_ranges_are_checked_at_registration_and_at_every_use(shm_dir: Path, registry: SystemShm) -> None:
    path = _segment(shm_dir, 128)
    with pytest.raises(InvalidArgument, match="invalid args"):
        registry.register("r", "/seg", 64, 65, uid=ME)
    registry.register("r", "/seg", 64, 64, uid=ME)
    with pytest.raises(InvalidArgument, match="Invalid offset"):
        registry.read("r", 60, 8, uid=ME)
    with pytest.raises(InvalidArgument, match="must fit|output"):
        registry.write("r", 0, 4, b"12345", uid=ME)
    os.truncate(path, 100)  # shrunk behind our back: an error, never a SIGBUS
    with pytest.raises(InvalidArgument, match="smaller than registered"):
        registry.read("r", 0, 64, uid=ME)
    with pytest.raises(InvalidArgument, match="smaller than registered"):
        registry.write("r", 0, 64, b"x" * 64, uid=ME)
    assert bytes(registry.read("r", 0, 36, uid=ME)) == bytes(range(64, 100))


def test_a_segment_replaced_under_the_same_key_is_refused(
    tmp_path: Path, shm_dir: Path, registry: SystemShm
) -> None:
    """The registering process holds the segment open (as Triton holds its mapping): it keeps reading the
    memory that was registered. Another process opening the key finds another file and refuses it."""
    path = _segment(shm_dir, 64)
    registry.register("r", "/seg", 0, 64, uid=ME)
    path.unlink()
    path.write_bytes(b"\xee" * 64)
    assert registry.read("r", 0, 4, uid=ME).tolist() == [0, 1, 2, 3]
    other = SystemShm(tmp_path / "registry", shm_dir)
    try:
        with pytest.raises(InvalidArgument, match="changed since it was registered"):
            other.read("r", 0, 8, uid=ME)
    finally:
        other.close()


def test_names_and_keys_are_registered_once(shm_dir: Path, registry: SystemShm) -> None:
    _segment(shm_dir, 64)
    registry.register("r", "/seg", 0, 64, uid=ME)
    with pytest.raises(AlreadyExists, match="already in manager"):
        registry.register("r", "/seg", 0, 8, uid=ME)
    with pytest.raises(InvalidArgument, match="under a different name"):
        registry.register("r2", "/seg", 0, 8, uid=ME)
    registry.unregister(uid=ME)
    assert registry.status(uid=ME) == ()
    registry.unregister("never-registered", uid=ME)  # as in Triton: not an error


def test_real_dev_shm_segment(tmp_path: Path) -> None:
    """The default folder is /dev/shm (what tritonclient.utils.shared_memory creates)."""
    key = f"fdunit_{uuid.uuid4().hex[:10]}"
    path = Path("/dev/shm") / key
    path.write_bytes(b"\x07" * 32)
    registry = SystemShm(tmp_path / "registry")
    try:
        registry.register("r", "/" + key, 0, 32, uid=ME)
        assert registry.read("r", 0, 32, uid=ME).tolist() == [7] * 32
    finally:
        registry.close()
        path.unlink()
