"""The cancellation flags of the requests of the running batch, which the worker sets on W_CANCEL.

A :class:`CancelFlag` is shared by the request's ``pb_utils.InferenceRequest`` and its response sender
(``is_cancelled()``). The worker's main thread sets it when a W_CANCEL arrives: while a model runs on its
own thread, the main thread is reading the socket anyway; while a model's ``execute`` runs on the main
thread itself, ``is_cancelled()`` asks the worker to read what has arrived first (the hook given to
:func:`set_poll`), so a cancel is seen as soon as the model looks, as in Triton, where the call asks the
server. A flag is made only for a request that someone asks about or cancels: a batch of requests that
nobody cancels costs a dict clear.

A cancel may come for a batch that has not begun yet (the broker sent it on while another runs, and it
waits in the socket): it is kept, a bounded number of them, and set when that batch begins, so a request
cancelled while it waits is never run by a model that looks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

__all__ = ["CancelFlag", "begin_batch", "cancel", "cancel_flag", "end_batch", "keep_batch", "set_poll"]

_lock = threading.Lock()
_flags: dict[int, CancelFlag] = {}
_running: frozenset[int] = frozenset()
_batch: int | None = None
_early: set[tuple[int, int]] = set()  # (batch, request) cancelled before its batch began
_kept: dict[int, dict[int, CancelFlag]] = {}  # batches that run on beside the next (``keep_batch``)
MAX_EARLY = 1024
_poll: Callable[[], None] | None = None
_main = threading.main_thread().ident


class CancelFlag:
    """Set once, read from any thread (a bool under the GIL: no lock, no ``threading.Event``)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        if not self._set and _poll is not None and threading.get_ident() == _main:
            _poll()  # the model runs on the main thread: read the cancels that came meanwhile
        return self._set


def set_poll(poll: Callable[[], None] | None) -> None:
    """What :meth:`CancelFlag.is_set` calls on the main thread before it answers (the worker's
    non-blocking read of its socket); None: nothing."""
    global _poll
    _poll = poll


def begin_batch(batch: int, ids: Iterable[int]) -> None:
    """The requests of the batch now running (the last batch's flags are forgotten)."""
    global _batch, _running
    with _lock:
        _batch = batch
        _running = frozenset(ids)
        _flags.clear()
        if _early:
            for b, r in list(_early):
                if b <= batch:  # batch ids only grow: an older batch never begins now
                    _early.discard((b, r))
                    if b == batch and r in _running:
                        _flag(r).set()


def keep_batch(batch: int) -> None:
    """The running ``batch`` runs on after the next begins (a decoupled model's ``async def execute``):
    its requests' flags stay settable until :func:`end_batch`."""
    with _lock:
        if batch == _batch:
            _kept[batch] = {r: _flag(r) for r in _running}


def end_batch(batch: int) -> None:
    """A batch kept by :func:`keep_batch` has ended."""
    with _lock:
        _kept.pop(batch, None)


def _flag(request: int) -> CancelFlag:
    """The flag of ``request``, made now if nobody asked before (``_lock`` held)."""
    flag = _flags.get(request)
    if flag is None:
        flag = _flags[request] = CancelFlag()
    return flag


def cancel_flag(request: int) -> CancelFlag:
    with _lock:
        return _flag(request)


def cancel(batch: int, request: int) -> bool:
    """Set the flag of ``request`` of ``batch`` if it runs, or keep it for when ``batch`` begins if that
    batch is still to come; False when neither (an older batch, or not one of this batch's requests)."""
    with _lock:
        if _batch is not None and batch > _batch:
            if len(_early) >= MAX_EARLY:
                return False
            _early.add((batch, request))
            return True
        kept = _kept.get(batch, {}).get(request)
        if kept is not None:
            flag = kept
        elif batch != _batch or request not in _running:
            return False
        else:
            flag = _flag(request)
    flag.set()
    return True
