"""Requests whose REJECT timeout passed are held by ``pop_ready`` for the next ``expire``; a cancel
(``remove``) reaches them too, and takes only those it matches (written against mutation survivors)."""

from __future__ import annotations

from zinfer.broker.batching.batcher import BatchPolicy, DynamicBatcher, QueuedRequest
from zinfer.modelconfig.scheduling import QueuePolicy

MS = 1e-3


def _batcher() -> DynamicBatcher[int]:
    policy = BatchPolicy(8, (), 50_000, default_queue_policy=QueuePolicy(default_timeout_microseconds=1000))
    b: DynamicBatcher[int] = DynamicBatcher(policy)
    for i in range(3):
        b.add(QueuedRequest(item=i, batch_size=1, shape_key="a", arrival=0.0), now=0.0)
    assert b.pop_ready(2 * MS, 0) == []  # no instance free; the three timed out and are now held
    return b


def test_remove_takes_only_the_matching_held_requests() -> None:
    b = _batcher()
    assert b.remove(lambda item: item == 1) == [1]
    assert b.next_expiry() is not None  # the other two are still held for expire()
    assert sorted(b.expire(2 * MS)) == [0, 2]


def test_removing_every_held_request_leaves_nothing_due() -> None:
    b = _batcher()
    assert sorted(b.remove(lambda item: True)) == [0, 1, 2]
    assert b.next_expiry() is None
    assert b.expire(3 * MS) == []
