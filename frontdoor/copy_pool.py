"""``CopyPool``: the front door's big system shared memory copies, run off its event loop.

A 4 MiB ``memcpy`` between a caller's segment and the arena costs the loop 300 to 600 µs, during which it
serves nobody; two per request (input in, output out) made the door's one thread the limit of the ``big``
benchmark. The copy (``_shmcopy``'s ``memcpy``) releases the GIL, so a copy run on a small thread pool
lets the loop go on (and, on a host with several cores, copies run beside each other). The hop to a
thread and back costs 20 to 25 µs of CPU (a 256 KiB ``memcpy``'s worth), so only copies of
``OFFLOAD_MIN_BYTES`` and over go there (``sysshm_caller.CallerShm``). A call cancelled while its copies
run leaves them to finish: each holds the memory it copies from and into.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["OFFLOAD_MIN_BYTES", "CopyPool"]

OFFLOAD_MIN_BYTES = 1 << 20
"""The smallest copy run on the pool: 80 to 100 µs of ``memcpy``, several times the hop's CPU."""

MAX_THREADS = 4


class CopyPool:
    """A lazily started pool of up to ``threads`` copy threads (the host's cores, at most ``MAX_THREADS``)."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or min(MAX_THREADS, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, copies: list[Callable[[], None]]) -> None:
        """Run ``copies`` on the pool and empty the list; the first copy's error is raised once all ran."""
        if not copies:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="shm-copy")
        pool, todo = self._pool, copies[:]
        copies.clear()
        loop = asyncio.get_running_loop()
        if len(todo) == 1:
            await loop.run_in_executor(pool, todo[0])
            return
        done = await asyncio.gather(*[loop.run_in_executor(pool, c) for c in todo], return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
