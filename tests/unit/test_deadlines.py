"""``client/deadlines.py``: an ``AsyncConnection``'s request timeouts on one timer of the event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from zinfer.client.deadlines import Deadlines


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_unanswered_requests_expire_at_their_deadlines_in_order_and_answered_ones_never() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        expired: list[tuple[int, float]] = []
        futs = [loop.create_future() for _ in range(4)]
        t0 = loop.time()
        d = Deadlines(loop, lambda f: expired.append((futs.index(f), loop.time() - t0)))
        for i, fut in enumerate(futs):
            assert d.add(fut, 0.05 + 0.02 * i) is None  # in order: all on the one timer
        futs[1].set_result(None)  # answered in time
        await asyncio.sleep(0.2)
        assert [i for i, _ in expired] == [0, 2, 3]
        for i, at in expired:
            assert at >= 0.05 + 0.02 * i - 0.002  # never before its deadline (the loop's clock resolution)
        assert len(d) == 0

    _run(go())


def test_an_earlier_deadline_than_one_queued_gets_a_timer_of_its_own() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        expired: list[asyncio.Future[Any]] = []
        d = Deadlines(loop, expired.append)
        slow, quick = loop.create_future(), loop.create_future()
        assert d.add(slow, 10.0) is None
        handle = d.add(quick, 0.02)
        assert handle is not None
        await asyncio.sleep(0.1)
        assert expired == [quick]  # on time, not behind the 10 s one
        d.close()

    _run(go())


def test_answered_requests_behind_a_waiting_one_do_not_pile_up() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        d = Deadlines(loop, lambda f: None)
        stuck = loop.create_future()
        d.add(stuck, 60.0)
        for _ in range(20_000):
            fut = loop.create_future()
            d.add(fut, 60.0)
            fut.set_result(None)
        assert len(d) <= 2048  # compacted: the stuck one and the few answered since the last compaction
        stuck.set_result(None)
        last = loop.create_future()
        d.add(last, 60.0)
        assert len(d) == 1  # the front is dropped as soon as it is answered
        d.close()
        assert len(d) == 0

    _run(go())


def test_close_cancels_the_timer() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        expired: list[asyncio.Future[Any]] = []
        d = Deadlines(loop, expired.append)
        d.add(loop.create_future(), 0.01)
        d.close()
        await asyncio.sleep(0.05)
        assert expired == []

    _run(go())


def test_a_request_answered_before_its_deadline_is_set_is_not_queued() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        expired: list[asyncio.Future[Any]] = []
        d = Deadlines(loop, expired.append)
        done = loop.create_future()
        done.set_result(None)  # its reply came in the turn that sent it
        assert d.add(done, 0.01) is None
        assert len(d) == 0
        answered, waiting = loop.create_future(), loop.create_future()
        d.add(answered, 0.01)
        answered.set_result(None)
        done2 = loop.create_future()
        done2.set_result(None)
        assert d.add(done2, 0.02) is None  # the queue holds only answered ones: no IndexError
        d.add(waiting, 0.03)
        await asyncio.sleep(0.1)
        assert expired == [waiting]
        d.close()

    _run(go())
