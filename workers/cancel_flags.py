"""The cancellation flags of the requests of the running batch, which the worker sets on W_CANCEL.

A flag is a ``threading.Event`` shared by the request's ``pb_utils.InferenceRequest`` and its response
sender (``is_cancelled()``); the worker's main thread sets it while the model runs on its own thread.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_flags: dict[int, threading.Event] = {}
_batch: int | None = None


def begin_batch(batch: int, ids: list[int]) -> None:
    """The requests of the batch now running: each gets a fresh flag (the last batch's are forgotten)."""
    global _batch
    with _lock:
        _batch = batch
        _flags.clear()
        _flags.update((i, threading.Event()) for i in ids)


def cancel_flag(request: int) -> threading.Event:
    with _lock:
        return _flags.setdefault(request, threading.Event())


def cancel(batch: int, request: int) -> bool:
    """Set the flag of ``request`` of ``batch`` if it runs; False when no running request is that one."""
    with _lock:
        flag = _flags.get(request) if batch == _batch else None
    if flag is None:
        return False
    flag.set()
    return True
