"""The dynamic batcher's byte limit (``max_batch_bytes``): a batch closes before the request that would pass
it, and a request that passes it alone is refused without being queued."""

from __future__ import annotations

import pytest

from zinfer.broker.batching.batcher import (
    BatchPolicy,
    BatchReason,
    BatchTooLarge,
    DynamicBatcher,
    QueuedRequest,
)

R = BatchReason

MiB = 1 << 20


def make(policy: BatchPolicy, sizes: list[int]) -> DynamicBatcher[int]:
    batcher: DynamicBatcher[int] = DynamicBatcher(policy)
    for i, nbytes in enumerate(sizes):
        batcher.add(QueuedRequest(item=i, batch_size=1, shape_key="a", arrival=0.0, nbytes=nbytes), now=0.0)
    return batcher


def taken(batcher: DynamicBatcher[int], free: int) -> list[tuple[list[int], BatchReason]]:
    return [(list(b.items), b.reason) for b in batcher.pop_ready(0.0, free)]


def test_a_batch_closes_before_the_request_that_would_pass_the_byte_limit() -> None:
    """Eight requests naming 128 MiB each make batches of at most 256 MiB, not one of 1 GiB."""
    batcher = make(BatchPolicy(8, max_batch_bytes=256 * MiB), [128 * MiB] * 8)
    assert taken(batcher, 8) == [
        ([0, 1], BatchReason.MAX_BYTES),
        ([2, 3], BatchReason.MAX_BYTES),
        ([4, 5], BatchReason.MAX_BYTES),
        ([6, 7], BatchReason.IDLE_NO_DELAY),  # the rest, as queued (no queue delay)
    ]


def test_byte_limit_cuts_mixed_sizes_in_order() -> None:
    batcher = make(BatchPolicy(8, max_batch_bytes=300), [100, 150, 100, 10, 290])
    batches = batcher.pop_ready(0.0, 8)
    assert [list(b.items) for b in batches] == [[0, 1], [2, 3], [4]]
    assert [b.reason for b in batches] == [R.MAX_BYTES, R.MAX_BYTES, R.IDLE_NO_DELAY]
    assert not batcher


def test_a_request_passing_the_limit_alone_is_refused_and_not_queued() -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(BatchPolicy(8, max_batch_bytes=100))
    with pytest.raises(BatchTooLarge, match="101 bytes are over the 100 byte limit"):
        batcher.add(QueuedRequest(item=0, batch_size=1, shape_key="a", arrival=0.0, nbytes=101), now=0.0)
    assert len(batcher) == 0
    batcher.add(QueuedRequest(item=1, batch_size=1, shape_key="a", arrival=0.0, nbytes=100), now=0.0)
    assert len(batcher) == 1


def test_without_batching_the_limit_still_refuses_a_request_alone() -> None:
    batcher: DynamicBatcher[int] = DynamicBatcher(BatchPolicy(0, max_batch_bytes=100))
    with pytest.raises(BatchTooLarge):
        batcher.add(QueuedRequest(item=0, batch_size=1, shape_key="a", arrival=0.0, nbytes=200), now=0.0)


def test_preferred_sizes_within_the_limit_are_unchanged() -> None:
    policy = BatchPolicy(8, preferred_batch_sizes=(2,), max_batch_bytes=1000)
    assert taken(make(policy, [100] * 4), 4) == [([0, 1], R.PREFERRED), ([2, 3], R.PREFERRED)]


def test_no_limit_by_default() -> None:
    assert taken(make(BatchPolicy(8), [1 << 40] * 8), 1) == [(list(range(8)), BatchReason.MAX_SIZE)]


def test_the_limit_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_batch_bytes"):
        BatchPolicy(8, max_batch_bytes=-1)
