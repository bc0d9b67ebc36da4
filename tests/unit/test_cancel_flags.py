"""The worker's cancellation flags: made on demand, set by W_CANCEL, read by the model (``is_cancelled``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from zinfer.workers.cancel_flags import MAX_EARLY, CancelFlags


@pytest.fixture
def cancel_flags() -> Iterator[CancelFlags]:
    yield CancelFlags()  # one worker's flags: nothing is shared between tests


def test_a_cancel_before_anyone_asked_is_seen_when_the_model_asks(cancel_flags: CancelFlags) -> None:
    cancel_flags.begin_batch(7, [1, 2])
    assert cancel_flags.cancel(7, 2)
    assert cancel_flags.flag(2).is_set()
    assert not cancel_flags.flag(1).is_set()


def test_a_flag_taken_first_is_the_one_a_later_cancel_sets(cancel_flags: CancelFlags) -> None:
    cancel_flags.begin_batch(7, [1])
    flag = cancel_flags.flag(1)
    assert not flag.is_set()
    assert cancel_flags.cancel(7, 1)
    assert flag.is_set()


def test_cancels_of_other_batches_or_requests_set_nothing(cancel_flags: CancelFlags) -> None:
    cancel_flags.begin_batch(7, [1])
    assert not cancel_flags.cancel(6, 1)  # an older batch
    assert not cancel_flags.cancel(7, 9)  # not in this batch
    assert not cancel_flags.flag(1).is_set()
    cancel_flags.begin_batch(8, [1])  # the next batch forgets the last one's flags
    assert cancel_flags.cancel(8, 1)
    cancel_flags.begin_batch(9, [1])
    assert not cancel_flags.flag(1).is_set()


def test_is_set_on_the_main_thread_reads_what_arrived_first(cancel_flags: CancelFlags) -> None:
    cancel_flags.begin_batch(3, [5])
    flag = cancel_flags.flag(5)
    calls: list[str] = []

    def poll() -> None:  # what the worker does: read the socket, and a W_CANCEL sets the flag
        calls.append(threading.current_thread().name)
        cancel_flags.cancel(3, 5)

    cancel_flags.set_poll(poll)
    seen: list[bool] = []
    other = threading.Thread(target=lambda: seen.append(flag.is_set()), name="model-thread")
    other.start()
    other.join(10)
    assert seen == [False] and calls == []  # another thread never reads the worker's socket
    assert flag.is_set()
    assert calls == [threading.main_thread().name]
    assert flag.is_set() and len(calls) == 1  # once set, no more reads


def test_a_cancel_for_a_batch_still_to_come_is_set_when_that_batch_begins(cancel_flags: CancelFlags) -> None:
    cancel_flags.begin_batch(7, [1])
    assert cancel_flags.cancel(9, 2)  # batch 9 waits in the worker's socket behind 7 (and 8)
    assert not cancel_flags.flag(1).is_set()
    cancel_flags.begin_batch(8, [2])  # another batch of the same request number: not the one cancelled
    assert not cancel_flags.flag(2).is_set()
    cancel_flags.begin_batch(9, [2, 3])
    assert cancel_flags.flag(2).is_set()
    assert not cancel_flags.flag(3).is_set()
    cancel_flags.begin_batch(10, [2])  # used once
    assert not cancel_flags.flag(2).is_set()


def test_cancels_kept_for_later_batches_are_bounded_and_dropped_once_passed(
    cancel_flags: CancelFlags,
) -> None:
    cancel_flags.begin_batch(0, [])
    kept = [cancel_flags.cancel(1 + i % 5, i) for i in range(MAX_EARLY + 10)]
    assert kept.count(True) == MAX_EARLY and not any(kept[MAX_EARLY:])
    cancel_flags.begin_batch(6, [0])  # every batch kept for has passed without beginning
    assert not cancel_flags.flag(0).is_set()
    assert cancel_flags.cancel(7, 0)  # room again
    cancel_flags.begin_batch(7, [0])
    assert cancel_flags.flag(0).is_set()


def test_batches_begun_without_flags_or_waiting_cancels_still_take_cancels(cancel_flags: CancelFlags) -> None:
    """``begin_batch`` skips its lock when there is nothing to forget or set: the batch is still the one a
    cancel names, an older one is refused, and a cancel kept for a later batch is still set when it begins."""
    cancel_flags.begin_batch(1, [1])
    cancel_flags.begin_batch(2, [5, 6])  # no flag made, no cancel waiting: the lock-free path
    assert not cancel_flags.cancel(1, 1)
    assert cancel_flags.cancel(2, 6)
    assert cancel_flags.flag(6).is_set() and not cancel_flags.flag(5).is_set()
    assert cancel_flags.cancel(4, 7)  # a later batch: kept
    cancel_flags.begin_batch(3, [7])  # flags of batch 2 to forget
    assert not cancel_flags.flag(7).is_set()
    cancel_flags.begin_batch(4, [7])  # the kept cancel is set now
    assert cancel_flags.flag(7).is_set()
    cancel_flags.begin_batch(5, [7])
    assert not cancel_flags.flag(7).is_set()
