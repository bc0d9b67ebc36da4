"""A Triton python model's own ``is_ready()``, which decides its readiness, as in Triton.

When the model defines it, the worker calls it once it has loaded and again whenever the broker asks (a
client asked whether the model is ready), one call at a time, each on its own thread so that neither the
socket nor the model's ``execute`` waits for it; an ``async def is_ready`` runs on the worker's event
loop. Its answer goes to the broker when the call ends, however long it took (the broker bounds each
readiness query's wait, ``zinfer.broker.readiness_waits``): True only for ``True``; an exception or any other
value is not ready. No second call starts while one runs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any

from .model_loop import ModelThreads

log = logging.getLogger(__name__)


class ReadinessCheck:
    def __init__(self, is_ready: Any, model: str, threads: ModelThreads) -> None:
        self._threads = threads
        self._is_ready = is_ready
        self._model = model
        self._lock = threading.Lock()
        self._running = False
        self._answer: bool | None = None  # an answer not yet sent to the broker

    @classmethod
    def of(cls, model: Any, name: str, threads: ModelThreads) -> ReadinessCheck | None:
        is_ready = getattr(getattr(model, "instance", None), "is_ready", None)
        return cls(is_ready, name, threads) if callable(is_ready) else None

    def start(self) -> None:
        """Call ``is_ready()`` now, unless a call is still running (its answer will do)."""
        with self._lock:
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._call, name="zinfer-is-ready", daemon=True).start()

    def _call(self) -> None:
        try:
            value = self._is_ready()
            if inspect.isawaitable(value):
                value = asyncio.run_coroutine_threadsafe(_awaited(value), self._threads.get().loop).result()
            ready = value is True
            if not isinstance(value, bool):
                log.warning("event=is_ready_not_bool model=%s value=%r", self._model, type(value).__name__)
        except Exception as exc:
            log.warning("event=is_ready_failed model=%s error=%r", self._model, exc)
            ready = False
        with self._lock:
            self._running = False
            self._answer = ready
        self._threads.wake.set()

    def take(self) -> bool | None:
        """The answer to send to the broker, once: the result of a call that ended."""
        with self._lock:
            answer, self._answer = self._answer, None
            return answer


async def _awaited(value: Any) -> Any:
    return await value
