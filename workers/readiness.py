"""A Triton python model's own ``is_ready()``, which decides its readiness, as in Triton.

When the model defines it, the worker calls it once it has loaded and again whenever the broker asks (a
client asked whether the model is ready), one call at a time, each on its own thread so that neither the
socket nor the model's ``execute`` waits for it; an ``async def is_ready`` runs on the worker's event
loop. Its answer goes to the broker, which answers readiness queries with the latest: True only for
``True``; an exception, any other value, or no answer within ``READINESS_TIMEOUT_S`` is not ready (a call
past that time still reports when it ends; no second call starts meanwhile).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import Any

from .model_loop import ModelThreads

log = logging.getLogger(__name__)

READINESS_TIMEOUT_S = 5.0


class ReadinessCheck:
    def __init__(self, is_ready: Any, model: str, threads: ModelThreads) -> None:
        self._threads = threads
        self._is_ready = is_ready
        self._model = model
        self._lock = threading.Lock()
        self._running = False
        self._deadline = 0.0
        self._late_reported = False
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
            self._late_reported = False
            self._deadline = time.monotonic() + READINESS_TIMEOUT_S
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
        """The answer to send to the broker, once: a call's result, or False for a call past its time."""
        with self._lock:
            if self._answer is not None:
                answer, self._answer = self._answer, None
                return answer
            if self._running and not self._late_reported and time.monotonic() > self._deadline:
                self._late_reported = True
                log.warning("event=is_ready_late model=%s seconds=%.1f", self._model, READINESS_TIMEOUT_S)
                return False
            return None


async def _awaited(value: Any) -> Any:
    return await value
