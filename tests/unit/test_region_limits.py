"""Boundaries of the region code, written to kill the mutants the mutation run (docs/testing.md) found alive:
exact-fit tensors, limits at and one past their value, byte and per-user accounting, the seals a segment
must carry, malformed region tables in the worker, and a worker's mapping reused only while its identity
holds."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from zinfer.broker.region_intake import HandedRegion, RegionIntake, check_sealed
from zinfer.broker.regions import RegionTable
from zinfer.broker.validation import check_request
from zinfer.client.errors import InvalidArgument, NotFound, ResourceExhausted, UnknownRegion
from zinfer.client.protocol import InferRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.regions import RegionCache

ME, OTHER = b"me", b"other"


def _handed(seg: Segment, uid: int | None = None) -> HandedRegion:
    st = os.fstat(seg.fd)
    return HandedRegion(os.dup(seg.fd), st.st_size, st.st_dev, st.st_ino, os.getuid() if uid is None else uid,
                        float("inf"))  # fmt: skip


@pytest.fixture
def segs() -> Iterator[list[Segment]]:
    made = [Segment.create_sealed(size) for size in (1024, 1024, 2048)]
    yield made
    for s in made:
        s.close()


# ---------------------------------------------------------------------------------------------- broker table


def test_a_region_records_what_was_handed_over(segs: list[Segment]) -> None:
    table = RegionTable()
    try:
        h = _handed(segs[0], uid=4242)
        region, held = table.register(ME, segs[0].name, h)
        assert held is None
        assert (region.fd, region.size, region.dev, region.ino) == (h.fd, 1024, h.dev, h.ino)
        assert region.uid == 4242
        assert region.wire() == [h.fd, h.dev, h.ino]
    finally:
        table.close()


def test_byte_accounting_follows_register_replace_and_unregister(segs: list[Segment]) -> None:
    table = RegionTable()
    try:
        table.register(ME, "zinfer-a", _handed(segs[0]))
        table.register(ME, "zinfer-b", _handed(segs[1]))
        assert table.total_bytes() == 2048 and table.count() == 2
        _, held = table.register(ME, "zinfer-a", _handed(segs[2]))  # replaced by a larger file
        assert held is not None and held.size == 1024
        RegionTable.release(held)
        assert table.total_bytes() == 3072 and table.count() == 2
        RegionTable.release(table.unregister(ME, "zinfer-b"))
        assert table.total_bytes() == 2048
        for region in table.drop_client(ME):
            RegionTable.release(region)
        assert table.total_bytes() == 0 and table.count() == 0 and table.clients() == []
    finally:
        table.close()


def test_size_limits_hold_at_their_value_and_refuse_one_past(segs: list[Segment]) -> None:
    table = RegionTable(max_region_bytes=1024, max_total_bytes=2048)
    try:
        table.register(ME, "zinfer-a", _handed(segs[0]))  # exactly max_region_bytes
        table.register(ME, "zinfer-b", _handed(segs[1]))  # the total now exactly max_total_bytes
        with pytest.raises(ResourceExhausted, match="over the 1024 byte limit"):
            table.register(ME, "zinfer-c", _handed(segs[2]))
        small = Segment.create_sealed(1)
        try:
            with pytest.raises(ResourceExhausted, match="2048 bytes of regions are taken"):
                table.register(ME, "zinfer-d", _handed(small))
        finally:
            small.close()
        _, held = table.register(ME, "zinfer-a", _handed(segs[1]))  # a same-size replacement grows nothing
        assert held is not None
        RegionTable.release(held)
        assert table.total_bytes() == 2048
    finally:
        table.close()


def test_per_user_limit_counts_each_region_once_and_frees_on_unregister(segs: list[Segment]) -> None:
    table = RegionTable(max_per_uid=2)
    try:
        table.register(ME, "zinfer-a", _handed(segs[0], uid=7))
        table.register(OTHER, "zinfer-b", _handed(segs[1], uid=7))  # the same user on another connection
        with pytest.raises(ResourceExhausted):
            table.register(ME, "zinfer-c", _handed(segs[2], uid=7))
        table.register(ME, "zinfer-c", _handed(segs[2], uid=8))  # another user is not affected
        RegionTable.release(table.unregister(OTHER, "zinfer-b"))
        table.register(OTHER, "zinfer-b", _handed(segs[1], uid=7))  # room again
    finally:
        table.close()


def test_user_byte_limit_counts_every_connection_and_frees_on_unregister(segs: list[Segment]) -> None:
    """segs are 1024, 1024 and 2048 bytes; one user may hold 3072 (exactly the limit is fine)."""
    table = RegionTable(max_uid_bytes=3072)
    try:
        table.register(ME, "zinfer-a", _handed(segs[0], uid=7))
        table.register(OTHER, "zinfer-b", _handed(segs[2], uid=7))  # 3072: exactly the limit
        assert table.user_bytes(7) == 3072
        with pytest.raises(ResourceExhausted, match="over the 3072 byte limit of one user"):
            table.register(ME, "zinfer-c", _handed(segs[1], uid=7))
        table.register(ME, "zinfer-c", _handed(segs[1], uid=8))  # another user is not affected
        _, held = table.register(ME, "zinfer-a", _handed(segs[1], uid=7))  # counts the new size only
        assert held is not None
        RegionTable.release(held)
        assert table.user_bytes(7) == 3072
        RegionTable.release(table.unregister(OTHER, "zinfer-b"))
        assert table.user_bytes(7) == 1024
        table.register(OTHER, "zinfer-b", _handed(segs[2], uid=7))  # room again
        for region in table.drop_client(ME) + table.drop_client(OTHER):
            RegionTable.release(region)
        assert table.user_bytes(7) == table.user_bytes(8) == 0
    finally:
        table.close()


def test_unregister_is_per_connection(segs: list[Segment]) -> None:
    table = RegionTable()
    try:
        table.register(ME, "zinfer-a", _handed(segs[0]))
        with pytest.raises(NotFound, match="no such region registered by this connection"):
            table.unregister(OTHER, "zinfer-a")
        with pytest.raises(NotFound):
            table.unregister(ME, "zinfer-nope")
        assert table.get("zinfer-a") is not None
        RegionTable.release(table.unregister(ME, "zinfer-a"))
        assert table.get("zinfer-a") is None
    finally:
        table.close()


@pytest.mark.parametrize(
    "offset, nbytes, ok",
    [
        (0, 1024, True),  # the whole region
        (1000, 24, True),  # ends exactly at the end
        (1024, 0, True),  # empty, at the very end
        (0, 0, True),
        (1001, 24, False),  # one byte past
        (1025, 0, False),
        (-1, 4, False),  # a negative offset alone
        (0, -1, False),  # a negative size alone
    ],
)
def test_broker_bounds_are_exact(segs: list[Segment], offset: int, nbytes: int, ok: bool) -> None:
    table = RegionTable()
    try:
        table.register(ME, "zinfer-a", _handed(segs[0]))
        ref = ShmRef("zinfer-a", offset, nbytes)
        if ok:
            table.check(ME, ref)
        else:
            with pytest.raises(InvalidArgument, match="invalid offset"):
                table.check(ME, ref)
        with pytest.raises(UnknownRegion, match="has not registered"):
            table.check(OTHER, ShmRef("zinfer-a", 0, 4))
    finally:
        table.close()


# ---------------------------------------------------------------------------------------------- requests

SIG = Signature.of(parse_model_config(
    """
    name: "m"
    max_batch_size: 4
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
    """, source="test", model_name="m"))  # fmt: skip
NOBATCH = Signature.of(parse_model_config(
    """
    name: "n"
    max_batch_size: 0
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
    """, source="test", model_name="n"))  # fmt: skip


def _check(sig: Signature, shapes: dict[str, tuple[int, ...]]) -> object:
    refs = tuple(TensorRef(n, "FP32", s, frame=i) for i, (n, s) in enumerate(shapes.items()))
    frames = [b"\0" * (4 * max(1, _prod(s))) for s in shapes.values()]
    return check_request(InferRequest("r", sig.name, 0, refs), frames, sig, RegionTable(), ME)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_batch_size_limits_and_input_bytes() -> None:
    checked = _check(SIG, {"A": (4, 2), "B": (4, 2)})  # exactly max_batch_size
    assert checked.batch_size == 4  # type: ignore[attr-defined]
    assert checked.input_bytes == 64  # type: ignore[attr-defined]  # both inputs counted
    assert _check(SIG, {"A": (1, 2), "B": (1, 2)}).batch_size == 1  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="batch"):
        _check(SIG, {"A": (5, 2), "B": (5, 2)})
    checked = _check(NOBATCH, {"A": (2,)})  # no batch dimension when max_batch_size is 0
    assert checked.batch_size == 1  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match=r"Expected \[2\], got \[1,2\]"):
        _check(NOBATCH, {"A": (1, 2)})


def test_inputs_must_agree_and_all_be_there() -> None:
    with pytest.raises(InvalidArgument, match="batch size does not match other inputs for 'm'"):
        _check(SIG, {"A": (2, 2), "B": (3, 2)})
    with pytest.raises(InvalidArgument, match=r"missing required input\(s\) \['B'\]"):
        _check(SIG, {"A": (1, 2)})


def test_the_tensor_byte_limit_holds_at_its_value() -> None:
    refs = (TensorRef("A", "FP32", (2, 2), frame=0), TensorRef("B", "FP32", (2, 2), frame=1))
    req = InferRequest("r", "m", 0, refs)
    frames = [b"\0" * 16, b"\0" * 16]
    assert check_request(req, frames, SIG, RegionTable(), ME, max_tensor_bytes=16).input_bytes == 32
    with pytest.raises(InvalidArgument, match="byte limit"):
        check_request(req, frames, SIG, RegionTable(), ME, max_tensor_bytes=15)


def test_dropping_a_connection_that_holds_no_region_drops_nothing() -> None:
    table = RegionTable()
    assert table.drop_client(b"nobody") == []
    seg = Segment.create_sealed(4096)
    try:
        st = os.fstat(seg.fd)
        handed = HandedRegion(os.dup(seg.fd), 4096, st.st_dev, st.st_ino, os.getuid(), 1e9)
        table.register(ME, seg.name, handed)
        assert table.drop_client(b"nobody") == []
        dropped = table.drop_client(ME)
        assert [r.name for r in dropped] == [seg.name]
        for r in dropped:
            RegionTable.release(r)
    finally:
        table.close()
        seg.close()


# ---------------------------------------------------------------------------------------------- hand-off


ALL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("zinfer-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    if size:
        os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.mark.parametrize(
    "size, seals, max_bytes, refusal",
    [
        (4096, ALL_SEALS, 0, None),
        (4096, ALL_SEALS, 4096, None),  # exactly the limit
        (4096, ALL_SEALS, 4095, "over the 4095 byte limit"),
        (4096, 0, 0, "sealed against shrinking"),  # an unsealed memory file
        (4096, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL, 0, "sealed against shrinking"),
        (4096, fcntl.F_SEAL_SHRINK, 0, "F_SEAL_SEAL"),  # a write seal could be added later (issue 30)
        (4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, 0, "F_SEAL_SEAL"),
        (4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL, 0, "F_SEAL_GROW"),  # could grow past what was counted
        (4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE, 0, "sealed against writing"),
        (0, ALL_SEALS, 0, "empty"),
    ],
)
def test_check_sealed(size: int, seals: int, max_bytes: int, refusal: str | None) -> None:
    fd = _memfd(size, seals)
    try:
        if refusal is None:
            assert check_sealed(fd, max_bytes).st_size == size
        else:
            with pytest.raises((InvalidArgument, ResourceExhausted), match=refusal):
                check_sealed(fd, max_bytes)
    finally:
        os.close(fd)


def test_a_regular_file_is_not_a_segment(tmp_path: object) -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(InvalidArgument, match="not a shared-memory segment"):
            check_sealed(r, 0)
    finally:
        os.close(r)
        os.close(w)


def test_handed_over_segments_carry_the_senders_uid_and_expire_at_their_time(tmp_path: object) -> None:
    from pathlib import Path

    from zinfer.client.region_handoff import hand_over

    now = [0.0]
    it = RegionIntake(Path(str(tmp_path)) / "r.sock", clock=lambda: now[0])
    watched: set[int] = set()
    it.watch(lambda fd, on: watched.add(fd) if on else watched.discard(fd))
    import threading

    stop = threading.Event()

    def serve() -> None:
        import select

        while not stop.is_set():
            ready, _, _ = select.select(list(watched), [], [], 0.02)
            for fd in ready:
                it.on_readable(fd)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    seg = Segment.create_sealed(4096)
    try:
        token = hand_over(it.path, seg.fd, 5.0)
        handed = it.claim(token)
        assert handed.uid == os.getuid() and handed.size == 4096
        os.close(handed.fd)
        token = hand_over(it.path, seg.fd, 5.0)
        stop.set()  # nothing serves the socket while the clock moves
        t.join(5)
        now[0] = 10.0  # exactly its time: expired
        it.expire()
        with pytest.raises(InvalidArgument, match="expired"):
            it.claim(token)
    finally:
        stop.set()
        t.join(5)
        it.close()
        seg.close()
    assert not it.path.exists()


# ---------------------------------------------------------------------------------------------- worker cache


class _Pins:
    def __init__(self) -> None:
        self.pinned: list[Segment] = []
        self.unpinned: list[Segment] = []

    def pin(self, seg: Segment) -> None:
        self.pinned.append(seg)

    def unpin(self, seg: Segment) -> None:
        self.unpinned.append(seg)


def _wire(seg: Segment) -> tuple[int, tuple[int, int, int]]:
    """A descriptor and the region's ``(fd, dev, ino)``, a tuple as ``execute_from_wire`` gives it."""
    fd = os.dup(seg.fd)
    st = os.fstat(fd)
    return fd, (fd, st.st_dev, st.st_ino)


def test_a_mapping_is_reused_while_its_identity_holds_and_dropped_when_it_changes() -> None:
    seg, again = Segment.create_sealed(4096), Segment.create_sealed(4096)
    pins = _Pins()
    regions = RegionCache(pinner=pins, owner=os.getpid())
    fd, wire = _wire(seg)
    fd2, wire2 = _wire(again)
    try:
        regions.use_table({"zinfer-x": wire})
        regions.bytes(ShmRef("zinfer-x", 0, 4))
        first = pins.pinned[-1]
        regions.begin_batch()
        regions.use_table({"zinfer-x": wire})
        regions.bytes(ShmRef("zinfer-x", 0, 4))
        assert pins.pinned == [first] and regions.mapped() == 1  # the same mapping, not a new one
        regions.use_table({"zinfer-x": wire2})  # registered again, another file
        regions.bytes(ShmRef("zinfer-x", 0, 4))
        assert len(pins.pinned) == 2 and pins.pinned[1] is not first
        assert pins.unpinned == [first] and first.map is None  # the old mapping is gone
        assert regions.mapped() == 1
    finally:
        regions.close()
        os.close(fd)
        os.close(fd2)
        seg.close()
        again.close()


@pytest.mark.parametrize(
    "offset, nbytes, ok",
    [(0, 4096, True), (4000, 96, True), (4096, 0, True), (4001, 96, False), (4097, 0, False), (-1, 4, False),
     (0, -1, False)],
)  # fmt: skip
def test_worker_bounds_are_exact(offset: int, nbytes: int, ok: bool) -> None:
    seg = Segment.create_sealed(4096)
    regions = RegionCache(owner=os.getpid())
    fd, wire = _wire(seg)
    try:
        regions.use_table({"zinfer-x": wire})
        if ok:
            assert len(regions.bytes(ShmRef("zinfer-x", offset, nbytes))) == nbytes
        else:
            with pytest.raises(InvalidArgument, match="outside"):
                regions.bytes(ShmRef("zinfer-x", offset, nbytes))
    finally:
        regions.close()
        os.close(fd)
        seg.close()


def test_a_worker_without_the_brokers_pid_maps_no_client_region() -> None:
    regions = RegionCache()
    try:
        regions.use_table({"zinfer-x": (3, 1, 1)})
        with pytest.raises(InvalidArgument, match="not available to this worker"):
            regions.bytes(ShmRef("zinfer-x", 0, 4))
    finally:
        regions.close()
