"""``client/call_waiter.py``: a sync call's waiter makes its Event only when its thread sleeps, and no wake is
lost, whether it comes before the sleep, during it, or from a reply."""

from __future__ import annotations

import threading
import time

from zinfer.client.call_waiter import Waiter
from zinfer.client.errors import Status
from zinfer.client.protocol import Reply


def test_a_caller_that_never_sleeps_never_makes_an_event() -> None:
    lock = threading.Lock()
    w = Waiter()
    with lock:
        w.reply = Reply("1", Status.OK)
        w.wake()
    assert w.done() and w.event is None
    t0 = time.monotonic()
    w.sleep(lock, 5.0)  # done: returns at once
    assert time.monotonic() - t0 < 1.0 and w.event is None


def test_a_wake_before_the_sleep_is_not_lost() -> None:
    lock = threading.Lock()
    w = Waiter()
    with lock:
        w.wake()  # e.g. handed the socket before it slept
    assert w.awake()
    t0 = time.monotonic()
    w.sleep(lock, 5.0)
    assert time.monotonic() - t0 < 1.0
    assert not w.awake()  # the mark is used up: the next sleep waits


def test_a_wake_during_the_sleep_ends_it() -> None:
    lock = threading.Lock()
    w = Waiter()

    def reply_later() -> None:
        time.sleep(0.05)
        with lock:
            w.reply = Reply("1", Status.OK)
            w.wake()

    t = threading.Thread(target=reply_later)
    t0 = time.monotonic()
    t.start()
    w.sleep(lock, 5.0)
    t.join()
    assert w.done() and time.monotonic() - t0 < 2.0
    assert w.event is not None and w.event.is_set()  # left set: the reply is there


def test_an_unanswered_sleep_times_out_and_clears_its_event() -> None:
    lock = threading.Lock()
    w = Waiter()
    t0 = time.monotonic()
    w.sleep(lock, 0.02)
    assert time.monotonic() - t0 >= 0.015
    assert w.event is not None and not w.event.is_set() and not w.done()


def test_a_stream_waiter_sleeps_again_once_its_replies_are_taken() -> None:
    from collections import deque

    lock = threading.Lock()
    w = Waiter(stream=deque())
    w.sleep(lock, 0.001)  # makes its event
    with lock:
        assert w.stream is not None
        w.stream.append((Reply("1", Status.OK), []))
        w.wake()
    assert w.done()
    assert w.stream is not None
    w.stream.popleft()
    w.rearm(lock)
    assert w.event is not None and not w.event.is_set() and not w.done()
