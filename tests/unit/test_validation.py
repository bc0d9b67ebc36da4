"""Descriptor and request checks made by the broker before anything is queued."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from zinfer.broker.region_intake import HandedRegion
from zinfer.broker.regions import RegionTable
from zinfer.broker.validation import check_request
from zinfer.client.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from zinfer.client.protocol import InferRequest, OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature

CONFIG = parse_model_config(
    """
    name: "m"
    max_batch_size: 4
    input [
      { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] },
      { name: "T" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
    """,
    source="test",
    model_name="m",
)
SIG = Signature.of(CONFIG)
ME, OTHER = b"me", b"other"


def handed(seg: Segment) -> HandedRegion:
    """What the hand-off socket would hold for ``seg``: a descriptor of its own."""
    st = os.fstat(seg.fd)
    return HandedRegion(os.dup(seg.fd), st.st_size, st.st_dev, st.st_ino, os.getuid(), float("inf"))


@pytest.fixture
def region() -> Iterator[tuple[RegionTable, Segment]]:
    seg = Segment.create_sealed(1024)
    table = RegionTable()
    assert table.register(ME, seg.name, handed(seg))[0].size == 1024
    yield table, seg
    table.close()
    seg.close()


def _req(
    x: TensorRef, t: TensorRef | None = None, outputs: tuple[OutputRequest, ...] | None = None
) -> InferRequest:
    t = t or TensorRef("T", "BYTES", (2, 1), frame=0)
    return InferRequest("r", "m", 0, (x, t), outputs)


FRAMES = [b"\x01\x00\x00\x00a\x01\x00\x00\x00b"]


def test_good_request(region: tuple[RegionTable, Segment]) -> None:
    table, seg = region
    x = TensorRef("X", "FP32", (2, 5, 3), shm=ShmRef(seg.name, 64, 120))
    checked = check_request(_req(x), FRAMES, SIG, table, ME)
    assert checked.batch_size == 2
    assert [o.name for o in checked.outputs] == ["Y"]
    wider = TensorRef("X", "FP32", (2, 6, 3), shm=ShmRef(seg.name, 0, 144))
    other = check_request(_req(wider), FRAMES, SIG, table, ME)
    assert other.shape_key != checked.shape_key  # a different variable dim never batches together


@pytest.mark.parametrize(
    "offset, nbytes, shape, message",
    [
        (1025, 0, (1, 0, 3), "invalid offset"),
        (1000, 48, (1, 4, 3), "invalid offset"),
        (2**63 - 8, 48, (1, 4, 3), "invalid offset"),
        (0, 44, (1, 4, 3), "input byte size mismatch for input 'X' for model 'm'. Expected 48, got 44"),
        (0, 64, (1, 4, 4), "unexpected shape for input 'X' for model 'm'. Expected [-1,-1,3], got [1,4,4]"),
        (0, 48, (4, 3), "unexpected shape for input 'X' for model 'm'. Expected [-1,-1,3], got [4,3]"),
        (0, 240, (5, 4, 3), "inference request batch-size must be <= 4 for 'm'"),
    ],
)
def test_bad_descriptors(
    region: tuple[RegionTable, Segment], offset: int, nbytes: int, shape: tuple[int, ...], message: str
) -> None:
    table, seg = region
    x = TensorRef("X", "FP32", shape, shm=ShmRef(seg.name, offset, nbytes))
    t = TensorRef("T", "BYTES", (shape[0], 1), frame=0)
    frames = [b"\x01\x00\x00\x00a" * shape[0]]
    with pytest.raises(InvalidArgument) as info:
        check_request(_req(x, t), frames, SIG, table, ME)
    assert message in str(info.value)


def test_region_of_another_connection(region: tuple[RegionTable, Segment]) -> None:
    table, seg = region
    x = TensorRef("X", "FP32", (2, 1, 3), shm=ShmRef(seg.name, 0, 24))
    with pytest.raises(InvalidArgument, match="not registered"):
        check_request(_req(x), FRAMES, SIG, table, OTHER)


def test_output_slot_checked(region: tuple[RegionTable, Segment]) -> None:
    table, seg = region
    x = TensorRef("X", "FP32", (2, 1, 3), shm=ShmRef(seg.name, 0, 24))
    with pytest.raises(InvalidArgument, match="invalid offset"):
        check_request(
            _req(x, outputs=(OutputRequest("Y", ShmRef(seg.name, 1020, 24)),)), FRAMES, SIG, table, ME
        )
    with pytest.raises(InvalidArgument, match="requested twice"):
        check_request(_req(x, outputs=(OutputRequest("Y"), OutputRequest("Y"))), FRAMES, SIG, table, ME)


def test_inline_frame_checks(region: tuple[RegionTable, Segment]) -> None:
    table, _ = region
    x = TensorRef("X", "FP32", (2, 1, 3), frame=1)
    with pytest.raises(InvalidArgument, match="names inline frame 1"):
        check_request(_req(x), FRAMES, SIG, table, ME)
    x = TensorRef("X", "FP32", (2, 1, 3), frame=0)
    with pytest.raises(InvalidArgument, match="same inline frame"):
        check_request(_req(x, TensorRef("T", "BYTES", (2, 1), frame=0)), [b"\0" * 24], SIG, table, ME)
    t = TensorRef("T", "BYTES", (2, 1), frame=1)
    with pytest.raises(InvalidArgument, match="too short for 2 BYTES elements"):
        check_request(
            _req(TensorRef("X", "FP32", (2, 1, 3), frame=0), t), [b"\0" * 24, b"abc"], SIG, table, ME
        )


def test_tensor_size_limit(region: tuple[RegionTable, Segment]) -> None:
    table, seg = region
    x = TensorRef("X", "FP32", (1, 10, 3), shm=ShmRef(seg.name, 0, 120))
    with pytest.raises(InvalidArgument, match="over the 100 byte limit"):
        check_request(_req(x, TensorRef("T", "BYTES", (1, 1), frame=0)), [b"\0" * 8], SIG, table, ME, 100)


def test_region_table() -> None:
    table = RegionTable(max_per_client=2, max_regions=3)
    segs = [Segment.create_sealed(64) for _ in range(4)]
    try:
        with pytest.raises(InvalidArgument, match="reserved"):
            table.register(ME, "zinfer-s1-0123456789abcdef", handed(segs[0]))
        with pytest.raises(NotFound):
            table.unregister(ME, "anything")
        first, replaced = table.register(ME, segs[0].name, handed(segs[0]))
        assert replaced is None and table.count() == 1 and table.get(segs[0].name) == first
        with pytest.raises(AlreadyExists, match="another connection"):  # a name is one connection's only
            table.register(OTHER, segs[0].name, handed(segs[1]))
        again, replaced = table.register(ME, segs[0].name, handed(segs[1]))  # registered again: replaces
        assert replaced == first and (again.dev, again.ino) != (first.dev, first.ino)
        table.release(first)
        table.register(ME, segs[2].name, handed(segs[2]))
        with pytest.raises(ResourceExhausted, match="at most 2"):  # per connection
            table.register(ME, segs[3].name, handed(segs[3]))
        table.register(OTHER, segs[3].name, handed(segs[3]))
        with pytest.raises(ResourceExhausted, match="maximum of 3"):  # in all
            table.register(b"third", "zinfer-cextra", handed(segs[3]))
        per_user = RegionTable(max_per_uid=1)
        per_user.register(b"x", "zinfer-cone", handed(segs[3]))
        with pytest.raises(ResourceExhausted, match="a user may"):  # per user, across its connections
            per_user.register(b"y", "zinfer-ctwo", handed(segs[3]))
        per_user.close()
        dropped = table.drop_client(ME)
        assert sorted(r.name for r in dropped) == sorted([segs[0].name, segs[2].name]) and table.count() == 1
        for r in dropped:
            table.release(r)
    finally:
        table.close()
        for seg in segs:
            seg.close()


def test_bytes_inputs_need_at_least_a_length_prefix_per_element(region: tuple[RegionTable, Segment]) -> None:
    """Two BYTES elements need 8 bytes (two empty strings) at the least: 8 passes, 7 is refused."""
    table, _ = region
    x = TensorRef("X", "FP32", (2, 1, 3), frame=0)
    t = TensorRef("T", "BYTES", (2, 1), frame=1)
    assert check_request(_req(x, t), [b"\0" * 24, b"\0" * 8], SIG, table, ME).batch_size == 2
    with pytest.raises(InvalidArgument, match="too short for 2 BYTES elements"):
        check_request(_req(x, t), [b"\0" * 24, b"\0" * 7], SIG, table, ME)


def test_shape_keys_ignore_the_batch_dim_only_when_the_model_batches(
    region: tuple[RegionTable, Segment],
) -> None:
    """Requests batch together when their shapes past the batch dim agree; a model without batching has
    no batch dim, so its whole shape is the key."""
    table, _ = region
    t1, t2 = TensorRef("T", "BYTES", (1, 1), frame=1), TensorRef("T", "BYTES", (2, 1), frame=1)
    one = check_request(_req(TensorRef("X", "FP32", (1, 2, 3), frame=0), t1), [b"\0" * 24, b"\0" * 4],
                        SIG, table, ME)  # fmt: skip
    two = check_request(_req(TensorRef("X", "FP32", (2, 2, 3), frame=0), t2), [b"\0" * 48, b"\0" * 8],
                        SIG, table, ME)  # fmt: skip
    assert one.shape_key == two.shape_key  # batch sizes 1 and 2 of the same shape go together
    wider = check_request(_req(TensorRef("X", "FP32", (1, 5, 3), frame=0), t1), [b"\0" * 60, b"\0" * 4],
                          SIG, table, ME)  # fmt: skip
    assert wider.shape_key != one.shape_key  # every dim past the batch dim counts, not only the last
    flat = Signature.of(parse_model_config(
        """
        name: "f"
        max_batch_size: 0
        input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        """, source="test", model_name="f"))  # fmt: skip

    def key(n: int) -> object:
        req = InferRequest("r", "f", 0, (TensorRef("A", "FP32", (n,), frame=0),))
        return check_request(req, [b"\0" * 4 * n], flat, table, ME).shape_key

    assert key(3) == key(3)
    assert key(3) != key(4)  # without batching the first dim is the model's own: it must not be dropped


def test_each_signature_is_checked_against_its_own_inputs(region: tuple[RegionTable, Segment]) -> None:
    """check_request reads a signature's inputs once (a cache by signature): a model reloaded with other
    dims, or a signature whose cache entry was dropped, is still checked against what it says."""
    from zinfer.broker import validation

    table, seg = region
    wider = Signature.of(parse_model_config(
        'name: "m" max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 4 ] },'
        ' { name: "T" data_type: TYPE_STRING dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_FP32'
        ' dims: [ 3 ] } ]', source="test", model_name="m"))  # fmt: skip
    x3 = TensorRef("X", "FP32", (1, 2, 3), shm=ShmRef(seg.name, 0, 24))
    x4 = TensorRef("X", "FP32", (1, 2, 4), shm=ShmRef(seg.name, 0, 32))
    t = TensorRef("T", "BYTES", (1, 1), frame=0)
    for _ in range(2):  # the second time from the cache
        assert check_request(_req(x3, t), FRAMES, SIG, table, ME).batch_size == 1
        assert check_request(_req(x4, t), FRAMES, wider, table, ME).batch_size == 1
        with pytest.raises(InvalidArgument, match=r"Expected \[-1,-1,3\], got \[1,2,4\]"):
            check_request(_req(x4, t), FRAMES, SIG, table, ME)
        with pytest.raises(InvalidArgument, match=r"Expected \[-1,-1,4\], got \[1,2,3\]"):
            check_request(_req(x3, t), FRAMES, wider, table, ME)
        with pytest.raises(InvalidArgument, match="expected 2 inputs but got 1 inputs"):
            check_request(InferRequest("r", "m", 0, (x3,)), [], SIG, table, ME)
    validation._RULES.clear()  # dropped (past _MAX_RULES): read again
    assert check_request(_req(x3, t), FRAMES, SIG, table, ME).outputs == (OutputRequest("Y"),)


@pytest.mark.parametrize(
    "as_frame",
    [bytes, memoryview, bytearray, lambda b: memoryview(b).cast("f"), lambda b: memoryview(b"pad" + b)[3:]],
    ids=["bytes", "memoryview", "bytearray", "float view", "slice of a view"],
)
def test_an_inline_frame_s_size_is_its_bytes_whatever_buffer_holds_it(
    region: tuple[RegionTable, Segment], as_frame: object
) -> None:
    """The size checked against the shape is the frame's length in bytes, not in items of its format."""
    table, _ = region
    make = as_frame if callable(as_frame) else bytes
    x = TensorRef("X", "FP32", (2, 1, 3), frame=1)
    good = [FRAMES[0], make(b"\0" * 24)]
    assert check_request(_req(x), good, SIG, table, ME).input_bytes == 24 + len(FRAMES[0])
    with pytest.raises(InvalidArgument, match="Expected 24, got 20"):
        check_request(_req(x), [FRAMES[0], make(b"\0" * 20)], SIG, table, ME)
