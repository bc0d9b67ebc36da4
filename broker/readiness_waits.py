"""Readiness queries of a Triton python model that defines its own ``is_ready()``, answered as Triton answers
them: from a fresh call, never from an older answer.

A query asks each instance of the model to call ``is_ready()`` (W_CHECK_READY), except an instance whose
call is still running: the query waits for that call's answer instead of starting another (one call in
flight per instance, as Triton's stub has). The query is answered once every instance it waits on has
answered (W_READINESS), ready when each said True, or not ready at ``READINESS_TIMEOUT_S`` (Triton's 5 s
bound); a call past that bound runs on, and later queries wait for it. An instance that stops meanwhile is
no longer waited on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from zinfer.client.errors import Status
from zinfer.client.protocol import Command, Reply
from zinfer.client.worker_protocol import Heartbeat, empty_to_wire

from .model_state import ModelState
from .outbox import Outbox

log = logging.getLogger(__name__)

READINESS_TIMEOUT_S = 5.0  # Triton's kUserModelReadinessTimeoutMs


@dataclass
class ReadinessWait:
    """One readiness query waiting for the instances in ``pending``."""

    client: bytes
    request_id: str
    state: ModelState
    deadline: float
    pending: set[bytes]
    ready: bool = True  # every answer so far was True


class ReadinessWaits:
    def __init__(self, outbox: Outbox, clock: Callable[[], float] = time.monotonic) -> None:
        self.outbox = outbox
        self.clock = clock
        self._waits: list[ReadinessWait] = []

    def __len__(self) -> int:
        return len(self._waits)

    def ask(self, state: ModelState, client: bytes, request_id: str) -> None:
        """A readiness query of ``state`` from ``client``: answered later, through the outbox."""
        state.readiness_asked &= state.instances  # instances that stopped will not answer
        for worker in state.instances - state.readiness_asked:
            if self.outbox.send_worker(worker, Command.W_CHECK_READY, empty_to_wire(Heartbeat())):
                state.readiness_asked.add(worker)
        wait = ReadinessWait(
            client, request_id, state, self.clock() + READINESS_TIMEOUT_S, set(state.readiness_asked)
        )
        if wait.pending:
            self._waits.append(wait)
        else:  # no instance to ask (none is running)
            self._answer(wait)

    def answered(self, state: ModelState, worker: bytes, ready: bool) -> None:
        """An instance's ``is_ready()`` answered: every query waiting on it takes the answer."""
        state.readiness_asked.discard(worker)
        for wait in list(self._waits):
            if wait.state is state and worker in wait.pending:
                wait.pending.discard(worker)
                wait.ready = wait.ready and ready
                if not wait.pending:
                    self._answer(wait)

    def expire(self, now: float) -> None:
        """Answer the queries past their bound (not ready) and those whose instances all stopped."""
        if not self._waits:
            return
        for wait in list(self._waits):
            wait.pending &= wait.state.instances
            if wait.pending and now >= wait.deadline:
                log.warning(
                    "event=is_ready_late model=%s seconds=%.1f", wait.state.name, READINESS_TIMEOUT_S
                )
                wait.ready = False
                wait.pending.clear()
            if not wait.pending:
                self._answer(wait)

    def _answer(self, wait: ReadinessWait) -> None:
        if wait in self._waits:
            self._waits.remove(wait)
        ready = wait.ready and wait.state.ready
        self.outbox.send_client(wait.client, Reply(wait.request_id, Status.OK, body=ready))
