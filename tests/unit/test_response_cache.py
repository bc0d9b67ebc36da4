"""The response cache: the LRU by bytes, the request key, and read-only region reads."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from zinfer.broker.response_cache import (
    ENTRY_OVERHEAD,
    TENSOR_OVERHEAD,
    CachedResponse,
    CachedTensor,
    RegionReader,
    ResponseCache,
    request_key,
)
from zinfer.client.protocol import ShmRef
from zinfer.client.shm import Segment


def resp(*sizes: int) -> CachedResponse:
    return CachedResponse(
        tuple(CachedTensor(f"OUT{i}", "UINT8", (n,), bytes(n)) for i, n in enumerate(sizes))
    )


def cost(*sizes: int) -> int:
    return ENTRY_OVERHEAD + sum(TENSOR_OVERHEAD + n for n in sizes)


# ------------------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ((), ENTRY_OVERHEAD),
        ((0,), ENTRY_OVERHEAD + TENSOR_OVERHEAD),
        ((16,), ENTRY_OVERHEAD + TENSOR_OVERHEAD + 16),
        ((16, 100), ENTRY_OVERHEAD + 2 * TENSOR_OVERHEAD + 116),
    ],
)
def test_an_entry_costs_its_data_and_a_fixed_overhead(sizes: tuple[int, ...], expected: int) -> None:
    assert resp(*sizes).nbytes == expected == cost(*sizes)


# ------------------------------------------------------------------------------------------ LRU


# (capacity in entries of one 100-byte tensor, operations, keys left from least to most recently used)
# "+k" puts k, "?k" looks k up (making it the most recently used when present)
LRU_TABLE = [
    (3, "+a +b +c", "abc"),
    (3, "+a +b +c +d", "bcd"),
    (3, "+a +b +c ?a +d", "cad"),
    (3, "+a +b +c ?a ?b +d +e", "bde"),
    (3, "+a +b +a +c +d", "acd"),  # putting a key again refreshes it
    (3, "+a ?x +b", "ab"),  # a miss changes nothing
    (1, "+a +b ?a +c", "c"),
    (2, "+a +b ?b ?a +c", "ac"),
]


@pytest.mark.parametrize(("entries", "ops", "left"), LRU_TABLE)
def test_eviction_order_is_least_recently_used(entries: int, ops: str, left: str) -> None:
    cache = ResponseCache(entries * cost(100))
    for op in ops.split():
        key = op[1:].encode()
        if op[0] == "+":
            assert cache.put(key, resp(100))
        else:
            cache.get(key)
    assert cache.keys() == [k.encode() for k in left]
    assert cache.used_bytes == len(left) * cost(100)
    assert cache.used_bytes <= cache.capacity


def test_hits_misses_and_evictions_are_counted() -> None:
    cache = ResponseCache(2 * cost(10))
    cache.put(b"a", resp(10))
    cache.put(b"b", resp(10))
    cache.put(b"c", resp(10))
    assert cache.get(b"a") is None
    assert cache.get(b"c") == resp(10)
    assert (cache.hits, cache.misses, cache.evictions) == (1, 1, 1)


def test_an_entry_larger_than_the_cache_is_refused_and_changes_nothing() -> None:
    cache = ResponseCache(cost(100))
    assert cache.put(b"small", resp(40))
    assert not cache.put(b"big", resp(101))
    assert cache.keys() == [b"small"] and cache.used_bytes == cost(40) and cache.refused == 1
    assert cache.put(b"exact", resp(100))  # exactly the capacity fits, evicting the rest
    assert cache.keys() == [b"exact"] and cache.used_bytes == cache.capacity


def test_a_zero_byte_cache_stores_nothing() -> None:
    cache = ResponseCache(0)
    assert not cache.put(b"a", resp())
    assert len(cache) == 0 and cache.used_bytes == 0


def test_byte_accounting_follows_replacements_and_removals() -> None:
    cache = ResponseCache(10_000)
    cache.put(b"a", resp(100))
    cache.put(b"b", resp(200, 300))
    assert cache.used_bytes == cost(100) + cost(200, 300)
    cache.put(b"a", resp(1000))  # replaced: the old size goes, the new one comes
    assert cache.used_bytes == cost(1000) + cost(200, 300)
    assert cache.remove(b"b") and not cache.remove(b"b")
    assert cache.used_bytes == cost(1000) and len(cache) == 1 and b"a" in cache
    cache.clear()
    assert cache.used_bytes == 0 and not cache.keys()


def test_mixed_sizes_evict_as_many_as_needed() -> None:
    cache = ResponseCache(cost(100) * 4)
    for key in (b"a", b"b", b"c", b"d"):
        cache.put(key, resp(100))
    big = resp(3 * cost(100) - ENTRY_OVERHEAD - TENSOR_OVERHEAD)  # costs exactly three small entries
    assert big.nbytes == 3 * cost(100)
    assert cache.put(b"big", big)
    assert cache.keys() == [b"d", b"big"]
    assert cache.used_bytes == 4 * cost(100)


def test_negative_capacity_is_an_error() -> None:
    with pytest.raises(ValueError):
        ResponseCache(-1)


# ------------------------------------------------------------------------------------------ key

X = ("X", "FP32", (1, 4), bytes(range(16)))
Y = ("Y", "INT32", (1, 2), bytes(8))
Input = tuple[str, str, tuple[int, ...], bytes]


def key(
    *inputs: Input,
    outputs: tuple[str, ...] = ("OUT",),
    model: str = "m",
    version: int = 1,
    generation: int = 1,
) -> bytes:
    return request_key(model, version, generation, inputs, outputs)


def test_the_key_is_the_same_for_the_same_request_wherever_its_bytes_are() -> None:
    k = key(X, Y)
    assert len(k) == 32
    assert key(Y, X) == k  # inputs in any order
    as_view = ("X", "FP32", (1, 4), memoryview(bytearray(X[3])))
    assert request_key("m", 1, 1, [as_view, Y], ["OUT"]) == k


@pytest.mark.parametrize(
    "other",
    [
        lambda: key(("X", "FP32", (1, 4), bytes(16)), Y),  # data
        lambda: key(("X", "INT32", (1, 4), X[3]), Y),  # datatype
        lambda: key(("X", "FP32", (4, 1), X[3]), Y),  # shape
        lambda: key(("X", "FP32", (1, 4, 1), X[3]), Y),  # rank
        lambda: key(("Z", "FP32", (1, 4), X[3]), Y),  # name
        lambda: key(X),  # an input fewer
        lambda: key(X, Y, outputs=("OUT", "OTHER")),  # outputs requested
        lambda: key(X, Y, outputs=()),
        lambda: key(X, Y, model="n"),
        lambda: key(X, Y, version=2),
        lambda: key(X, Y, generation=2),  # a reload: entries of the old model are never hits
    ],
)
def test_every_part_of_the_request_changes_the_key(other: object) -> None:
    assert callable(other)
    assert other() != key(X, Y)


def test_fields_are_length_prefixed() -> None:
    a = key(("AB", "FP32", (1,), b"C"))
    b = key(("A", "FP32", (1,), b"BC"))
    assert a != b
    assert key(X, outputs=("AB", "C")) != key(X, outputs=("A", "BC"))
    assert key(X, outputs=("A", "B")) != key(X, outputs=("B", "A"))


# ------------------------------------------------------------------------------------------ regions


@pytest.fixture
def segment() -> Iterator[Segment]:
    seg = Segment.create(4096)
    seg.buf[:16] = bytes(range(16))
    yield seg
    seg.close()


def test_reads_a_range_of_a_region_read_only(segment: Segment) -> None:
    reader = RegionReader()
    view = reader.read(ShmRef(segment.name, 4, 8))
    assert view is not None and view.readonly
    assert bytes(view) == bytes(range(4, 12))
    view.release()
    assert reader.copy(ShmRef(segment.name, 0, 4)) == bytes(range(4))
    assert len(reader) == 1  # mapped once
    reader.close()
    assert len(reader) == 0


@pytest.mark.parametrize("ref", [(0, 4097), (4096, 1), (5000, 0), (-1, 4)])
def test_a_range_outside_the_region_reads_nothing(segment: Segment, ref: tuple[int, int]) -> None:
    reader = RegionReader()
    assert reader.read(ShmRef(segment.name, *ref)) is None
    reader.close()


def test_a_region_shrunk_after_mapping_reads_nothing(segment: Segment) -> None:
    reader = RegionReader()
    assert reader.copy(ShmRef(segment.name, 2048, 16)) == bytes(16)
    fd = os.open(f"/dev/shm/{segment.name}", os.O_RDWR)
    try:
        os.ftruncate(fd, 1024)
    finally:
        os.close(fd)
    assert reader.read(ShmRef(segment.name, 2048, 16)) is None
    assert reader.copy(ShmRef(segment.name, 0, 16)) == bytes(range(16))
    reader.close()


def test_missing_regions_read_nothing_and_unlinked_ones_are_pruned() -> None:
    reader = RegionReader()
    assert reader.read(ShmRef("zinfer-c1-0000000000000000", 0, 1)) is None
    assert reader.read(ShmRef("../etc/passwd", 0, 1)) is None
    seg = Segment.create(64)
    assert reader.copy(ShmRef(seg.name, 0, 1)) == b"\0"
    assert reader.prune() == 0
    seg.close()  # unlinks it
    assert reader.prune() == 1 and len(reader) == 0


def test_the_reader_maps_a_bounded_number_of_regions() -> None:
    reader = RegionReader(max_regions=2)
    segs = [Segment.create(64) for _ in range(3)]
    try:
        for s in segs:
            assert reader.copy(ShmRef(s.name, 0, 8)) == bytes(8)
        assert len(reader) == 2
    finally:
        reader.close()
        for s in segs:
            s.close()
