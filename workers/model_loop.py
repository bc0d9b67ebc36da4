"""Where a Triton-style model's ``execute`` runs: the worker's main thread, or one model thread and one
asyncio event loop per worker.

A plain ``def execute`` of a model that is not decoupled runs on the worker's main thread when the instance is
on the CPU (see :meth:`ModelThreads.run`): a client's CANCEL is then read when the model asks
``request.is_cancelled()``. On a GPU instance, and for every decoupled model, it runs on the model thread; an
``async def execute`` runs on the event loop, which lives as long as the worker, so what it awaits
(``InferenceRequest.async_exec``, its own tasks) may outlive one call, as in Triton where the loop is shared
by a model instance's requests. While the model runs on those, the main thread stays free to read the socket
(a CANCEL reaches ``request.is_cancelled()`` at once) and to send what a decoupled model's response senders
queue from any thread. The main thread waits through a *pump* the worker installs
(:meth:`ModelThreads.set_pump`): it runs until its predicate holds, woken by :attr:`ModelThreads.wake`, which
every finished call and every queued response sets. Without a worker (unit tests) the default pump just sleeps
on the wake. One :class:`ModelThreads` per worker, held by its ``WorkerRuntime``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import select
import threading
import types
from collections.abc import Callable
from typing import Any

from zinfer.client.errors import Unavailable


class Wake:
    """A self-pipe any thread may set; the worker's pump polls its ``fd`` beside the socket."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        try:
            os.write(self._write, b"x")
        except BlockingIOError:
            pass  # already full: the reader will wake anyway

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass


Pump = Callable[[Callable[[], bool]], bool]
"""Runs until the predicate is true (True), or gives up because the worker is stopping (False)."""


class ModelLoop:
    """The model thread and the event loop thread, started on first use."""

    def __init__(self, wake: Wake, setup: Callable[[], None] | None = None) -> None:
        self._wake = wake
        self._setup = setup
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_loop, name="zinfer-model-loop", daemon=True)
        self._loop_thread.start()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="zinfer-model", initializer=self._thread_setup
        )

    def _thread_setup(self) -> None:
        if self._setup is not None:
            self._setup()

    def _run_loop(self) -> None:
        self._thread_setup()
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()  # stopped by close(): its selector and self-pipe go with it, not at a later gc

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Start ``fn(*args)``: a coroutine function on the loop, anything else on the model thread (an
        awaitable it returns is then awaited on the loop). The wake is set when it is done."""
        if inspect.iscoroutinefunction(fn):
            future = asyncio.run_coroutine_threadsafe(_awaited(fn(*args)), self._loop)
        else:
            future = self._executor.submit(self._call, fn, *args)
        future.add_done_callback(self._woken)
        return future

    def start_coroutine(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        """Run an awaitable on the loop without waiting for it (a decoupled model's ``async def execute``
        called already: its batches run side by side); the wake is set when it is done."""
        future = asyncio.run_coroutine_threadsafe(_awaited(coroutine), self._loop)
        future.add_done_callback(self._woken)
        return future

    def _woken(self, _: object) -> None:
        self._wake.set()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        result = fn(*args)
        if inspect.isawaitable(result):
            return asyncio.run_coroutine_threadsafe(_awaited(result), self._loop).result()
        return result

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._loop.call_soon_threadsafe(self._loop.stop)


class ModelExit(Exception):
    """A model's ``SystemExit`` (``sys.exit`` in an ``async def``), caught inside its coroutine: raised on the
    event loop it would stop the loop itself and leave every batch on it unanswered; as this, it fails its
    batch like any exception of the model's (as under Triton's stub) and the worker serves on."""


async def _awaited(awaitable: Any) -> Any:
    try:
        return await awaitable
    except SystemExit as exc:
        raise ModelExit(f"SystemExit: {exc}") from exc


_PLAIN: set[Callable[..., Any]] = set()
"""Plain functions (not coroutine functions) ``ModelThreads.run`` was given (``call_with``, mostly):
``inspect.iscoroutinefunction`` costs about a µs per call, and a function's kind does not change."""


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    plain = type(fn) is types.FunctionType  # hashable, and usually module-level: a few of them
    if plain and fn in _PLAIN:
        return False
    if inspect.iscoroutinefunction(fn):
        return True
    if plain and len(_PLAIN) < 64:
        _PLAIN.add(fn)
    return False


class ModelThreads:
    """One worker's model thread and event loop (started on first use), its wake and its pump."""

    def __init__(self) -> None:
        self.wake = Wake()
        self._lock = threading.Lock()
        self._loop: ModelLoop | None = None
        self._setup: Callable[[], None] | None = None
        self._pump: Pump = self._sleep_pump

    def _sleep_pump(self, done: Callable[[], bool]) -> bool:
        while not done():
            select.select([self.wake.fd], [], [], 0.5)
            self.wake.clear()
        return True

    def set_pump(self, pump: Pump | None) -> None:
        self._pump = pump or self._sleep_pump

    def pump(self, done: Callable[[], bool]) -> bool:
        return self._pump(done)

    def configure(self, setup: Callable[[], None] | None) -> None:
        """What each of the two threads runs first (a GPU instance makes its device current there); threads
        already started are replaced."""
        self.close()
        self._setup = setup

    def get(self) -> ModelLoop:
        with self._lock:
            if self._loop is None:
                self._loop = ModelLoop(self.wake, self._setup)
            return self._loop

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` for the worker's main thread, which waits for it (pumping its socket meanwhile).

        A plain function runs on the calling thread itself when the threads have no setup to run first (a
        CPU instance): handing it to the model thread and back costs more than a small model's whole
        ``execute`` on these machines (tens of µs of thread wake-ups per call). Triton's stub runs
        ``execute`` on the thread that ran ``initialize`` too. A cancel that arrives meanwhile is read when
        the model asks (``is_cancelled()``, see ``cancel_flags``). With a setup (a GPU instance: its device
        current on the model thread), and for a coroutine function, the call goes to the model thread or
        the loop as :meth:`ModelLoop.submit` says; an awaitable a plain function returns is awaited on the
        loop.
        """
        if self._setup is None and not _is_coroutine_function(fn):
            result = fn(*args)
            if type(result) is list or not inspect.isawaitable(result):  # execute's list: the usual
                return result
            loop = self.get()
            future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(
                _awaited(result), loop.loop
            )
            future.add_done_callback(loop._woken)
        else:
            future = self.get().submit(fn, *args)
        if not self.pump(future.done):
            raise Unavailable("the worker is stopping")
        return future.result()

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.close()
                self._loop = None
