"""``CopyPool``: the front door's big system shared memory copies, run off its event loop.

A 4 MiB ``memcpy`` between a caller's segment and the arena costs the loop 300 to 600 µs, during which it
serves nobody; two per request (input in, output out) made the door's one thread the limit of the ``big``
benchmark. The copy (``_shmcopy``'s ``memcpy``) releases the GIL, so a copy run on a copy thread lets the
loop go on meanwhile. The hop to a thread and back costs CPU (the thread's wake-up, its two turns with the
GIL, the loop's wake-up: 20 to 25 µs, a 256 KiB ``memcpy``'s worth), so only copies of
``OFFLOAD_MIN_BYTES`` and over go there (``sysshm_caller.CallerShm``), and the hop is the lean kind: a
queue of (copy, future) and ``call_soon_threadsafe``, no ``concurrent.futures`` machinery. One thread by
default: at 250 requests/s of ``big`` (``perf stat`` on the door, in turns with main) a
``ThreadPoolExecutor`` of two cost the door 15-25 % more CPU than copying on the loop (three times the
context switches), this one thread about the same CPU; two copy threads would mostly trade the GIL
between them. A call cancelled while its copies run leaves them to finish: each holds the memory it copies
from and into.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

__all__ = ["OFFLOAD_MIN_BYTES", "CopyPool"]

OFFLOAD_MIN_BYTES = 1 << 20
"""The smallest copy run on the pool: 80 to 100 µs of ``memcpy``, several times the hop's CPU."""

_Job = tuple[Callable[[], None], "asyncio.Future[None]", asyncio.AbstractEventLoop]


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class CopyPool:
    """``threads`` copy threads (module doc: one by default), started when first needed."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, threads)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._started: list[threading.Thread] = []

    async def run(self, copies: list[Callable[[], None]]) -> None:
        """Run ``copies`` on the pool and empty the list; the first copy's error is raised once all ran."""
        if not copies:
            return
        todo = copies[:]
        copies.clear()
        loop = asyncio.get_running_loop()
        if len(self._started) < self.threads:
            self._start(min(self.threads, len(self._started) + len(todo)))
        futs = []
        for copy in todo:
            fut: asyncio.Future[None] = loop.create_future()
            self._jobs.put((copy, fut, loop))
            futs.append(fut)
        if len(futs) == 1:
            await futs[0]
            return
        done = await asyncio.gather(*futs, return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result

    def _start(self, count: int) -> None:
        while len(self._started) < count:
            thread = threading.Thread(target=self._serve, name=f"shm-copy-{len(self._started)}", daemon=True)
            thread.start()
            self._started.append(thread)

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            copy, fut, loop = job
            error: BaseException | None = None
            try:
                copy()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting call
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, fut, error)
            except RuntimeError:  # the loop closed meanwhile: nobody waits
                pass
            del job, copy, fut, error

    def close(self) -> None:
        for _ in self._started:
            self._jobs.put(None)
        self._started = []
