"""The cancellation flags of the requests of the running batch, which the worker sets on W_CANCEL (one
:class:`CancelFlags` per worker, held by its ``WorkerRuntime``).

A :class:`CancelFlag` is shared by the request's ``pb_utils.InferenceRequest`` and its response sender
(``is_cancelled()``). The worker's main thread sets it when a W_CANCEL arrives: while a model runs on its own
thread, the main thread is reading the socket anyway; while a model's ``execute`` runs on the main thread
itself, ``is_cancelled()`` asks the worker to read what has arrived first (the hook given to
:meth:`CancelFlags.set_poll`), so a cancel is seen as soon as the model looks, as in Triton, where the call
asks the server. A flag is made only for a request that someone asks about or cancels: a batch of requests
that nobody cancels costs a dict clear.

A cancel may come for a batch that has not begun yet (the broker sent it on while another runs, and it
waits in the socket): it is kept, a bounded number of them, and set when that batch begins, so a request
cancelled while it waits is never run by a model that looks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

__all__ = ["MAX_EARLY", "CancelFlag", "CancelFlags"]

MAX_EARLY = 1024
_MAIN = threading.main_thread().ident


class CancelFlag:
    """Set once, read from any thread (a bool under the GIL: no lock, no ``threading.Event``)."""

    __slots__ = ("_owner", "_set")

    def __init__(self, owner: CancelFlags | None = None) -> None:
        self._set = False
        self._owner = owner

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        owner = self._owner
        if not self._set and owner is not None and owner.poll is not None and threading.get_ident() == _MAIN:
            owner.poll()  # the model runs on the main thread: read the cancels that came meanwhile
        return self._set


class CancelFlags:
    """The flags of one worker's running batch (and of the batches kept running beside it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[int, CancelFlag] = {}
        self._running: Collection[int] = ()  # the running batch's request ids, as the worker gave them
        self._batch: int | None = None
        self._early: set[tuple[int, int]] = set()  # (batch, request) cancelled before its batch began
        self._kept: dict[int, dict[int, CancelFlag]] = {}  # batches that run on beside the next
        self.poll: Callable[[], None] | None = None
        """What :meth:`CancelFlag.is_set` calls on the main thread before it answers (the worker's
        non-blocking read of its socket); None: nothing."""

    def set_poll(self, poll: Callable[[], None] | None) -> None:
        self.poll = poll

    def begin_batch(self, batch: int, ids: Collection[int]) -> None:
        """The requests of the batch now running (the last batch's flags are forgotten). ``ids`` is kept as
        given, not copied: it is read only when a cancel comes, and a batch is small.

        The usual batch (no flag made for the last one, no cancel waiting for a later one) takes no lock:
        the two stores are each atomic, and what reads them together (``cancel``, ``keep_batch``) runs on
        the worker's main thread, as this does."""
        if not self._flags and not self._early:
            self._batch = batch
            self._running = ids
            return
        with self._lock:
            self._batch = batch
            self._running = ids
            if self._flags:
                self._flags.clear()
            if self._early:
                for b, r in list(self._early):
                    if b <= batch:  # batch ids only grow: an older batch never begins now
                        self._early.discard((b, r))
                        if b == batch and r in self._running:
                            self._flag(r).set()

    def keep_batch(self, batch: int) -> None:
        """The running ``batch`` runs on after the next begins (a decoupled model's ``async def execute``):
        its requests' flags stay settable until :meth:`end_batch`."""
        with self._lock:
            if batch == self._batch:
                self._kept[batch] = {r: self._flag(r) for r in self._running}

    def end_batch(self, batch: int) -> None:
        """A batch kept by :meth:`keep_batch` has ended."""
        with self._lock:
            self._kept.pop(batch, None)

    def _flag(self, request: int) -> CancelFlag:
        """The flag of ``request``, made now if nobody asked before (``_lock`` held)."""
        flag = self._flags.get(request)
        if flag is None:
            flag = self._flags[request] = CancelFlag(self)
        return flag

    def flag(self, request: int) -> CancelFlag:
        with self._lock:
            return self._flag(request)

    def flags(self, requests: list[int]) -> list[CancelFlag]:
        """The flags of ``requests``, in order (``flag`` of each, under one hold of the lock)."""
        with self._lock:
            return [self._flag(r) for r in requests]

    def cancel(self, batch: int, request: int) -> bool:
        """Set the flag of ``request`` of ``batch`` if it runs, or keep it for when ``batch`` begins if that
        batch is still to come; False when neither (an older batch, or not one of this batch's requests)."""
        with self._lock:
            if self._batch is not None and batch > self._batch:
                if len(self._early) >= MAX_EARLY:
                    return False
                self._early.add((batch, request))
                return True
            kept = self._kept.get(batch, {}).get(request)
            if kept is not None:
                flag = kept
            elif batch != self._batch or request not in self._running:
                return False
            else:
                flag = self._flag(request)
        flag.set()
        return True
