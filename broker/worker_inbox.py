"""Messages from the workers: heartbeats, READY (and the GPU look-ahead's second READY), LOAD_FAILED and
RESULT, each read through its record in ``zinfer.client.worker_protocol``.

A heartbeat is answered on the same socket (its identity carries ``protocol.HEARTBEAT_SUFFIX``); READY makes
the worker an instance with a place in the pool (``instance_pool``); LOAD_FAILED marks its model
unavailable with the worker's reason; RESULT goes to request completion (``Completion.take_result``), then
the freed instance's next batch to dispatch (``Dispatcher.dispatch_freed``), then the replies to completion
(``Completion.on_result``), so the instance computes while the broker answers; a partial result of a
decoupled model to ``Completion.on_partial``. A
message from a worker the pool does not know is answered with SHUTDOWN; a malformed one is logged and
dropped, never allowed to raise in the broker loop. A heartbeat that carries the model's custom metrics
hands them, checked, to ``custom_metrics`` (the server's metrics' store); one from a GPU worker
carries the device memory it holds (``device_bytes``, for on-demand model control's budgets).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from zinfer.client import protocol
from zinfer.client.errors import ProtocolError, ServerError
from zinfer.client.metric_snapshot import families_from_wire
from zinfer.client.protocol import Command, Frame
from zinfer.client.worker_protocol import (
    Heartbeat,
    Shutdown,
    WorkerResult,
    decode_result,
    empty_to_wire,
    load_failed_from_wire,
    readiness_from_wire,
    ready_from_wire,
    result_from_wire,
)

from .completion import Completion
from .custom_metrics import CustomMetrics
from .dispatcher import Dispatcher
from .instance_pool import InstancePool
from .model_state import ModelState
from .outbox import Outbox
from .readiness_waits import ReadinessWaits

log = logging.getLogger(__name__)


class WorkerInbox:
    def __init__(
        self,
        pool: InstancePool,
        outbox: Outbox,
        completion: Completion,
        dispatcher: Dispatcher,
        custom_metrics: CustomMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.outbox = outbox
        self.dispatcher = dispatcher  # a freed instance's next batch leaves before the replies are built
        self.custom_metrics = custom_metrics
        self._reported: set[bytes] = set()  # workers whose last heartbeat carried custom metrics
        self.device_bytes: dict[bytes, int] = {}  # device memory a GPU worker's last heartbeat reported
        self.completion = completion
        self.clock = clock
        self.readiness = ReadinessWaits(outbox, clock)  # queries of models with their own is_ready()

    def _custom_metrics(self, worker: bytes, header: Mapping[str, Any]) -> None:
        """The model code's custom metrics a heartbeat carries: checked, then kept for the scrape."""
        state = self.pool.state_of(worker)
        if (
            self.custom_metrics is None
            or state is None
            or ("metrics" not in header and worker not in self._reported)
        ):
            return
        try:
            families = families_from_wire(header.get("metrics", []))
        except ProtocolError as exc:
            log.warning("event=bad_custom_metrics worker=%s error=%r", worker, str(exc))
            return
        if families:
            self._reported.add(worker)
        else:
            self._reported.discard(worker)
        self.custom_metrics.update(worker, state.name, state.version, families)

    def on_result(
        self, identity: bytes, state: ModelState, result: WorkerResult, frames: list[Frame]
    ) -> None:
        if result.partial:
            self.completion.on_partial(identity, state, result, frames)
            return
        batch = self.completion.take_result(identity, state, result)
        if batch is not None:
            self.dispatcher.dispatch_freed(state)  # the instance's next batch leaves first
            self.completion.on_result(identity, state, batch, result, frames)

    def on_message(self, identity: bytes, frames: list[Frame]) -> None:
        """One message from the worker socket (``identity`` as the ROUTER names the sender)."""
        try:
            msg = decode_result(frames) or protocol.decode(frames, protocol.WORKER_COMMANDS)
        except ProtocolError as bad:  # (one name per handler: see scheduler.Batching.add)
            log.warning("event=bad_worker_message worker=%s error=%r", identity, str(bad))
            return
        if msg.command == Command.W_HEARTBEAT and identity.endswith(protocol.HEARTBEAT_SUFFIX):
            worker = identity[: -len(protocol.HEARTBEAT_SUFFIX)]
            if self.pool.heartbeat(worker, self.clock()):
                self.outbox.send_worker(identity, Command.W_HEARTBEAT, empty_to_wire(Heartbeat()))
                self._custom_metrics(worker, msg.header)
                used = msg.header.get("device_bytes")
                if type(used) is int and 0 <= used < 1 << 62:
                    self.device_bytes[worker] = used
            return
        state = self.pool.state_of(identity)
        if state is None:
            log.warning("event=unknown_worker worker=%s", identity)
            self.outbox.send_worker(identity, Command.W_SHUTDOWN, empty_to_wire(Shutdown()))
            return
        try:
            ready = ready_from_wire(msg.header) if msg.command == Command.W_READY else None
            if ready is not None and ready.slot != 1:
                # a GPU worker that stages the next batch's inputs while it computes (gpu_prefetch) asks
                # for a second place, an async execute's for up to MAX_SLOT; models whose batches must
                # wait for the last one's result get none
                if self.pool.second_place(identity, ready.slot):
                    log.info("event=instance_prefetch model=%s worker=%s", state.name, identity.decode())
            elif ready is not None:
                self.pool.ready(identity)
                log.info(
                    "event=instance_ready model=%s version=%d worker=%s pid=%s",
                    state.name,
                    state.version,
                    identity.decode(),
                    ready.pid,
                )
            elif msg.command == Command.W_LOAD_FAILED:
                state.error = load_failed_from_wire(msg.header).error
                # ModelControl logs the load's failure once (event=model_load_failed); each instance's
                # report is detail
                log.debug(
                    "event=instance_load_failed model=%s version=%d error=%r",
                    state.name,
                    state.version,
                    state.error,
                )
            elif msg.command == Command.W_RESULT:
                self.on_result(identity, state, result_from_wire(msg.record_or_header), msg.frames)
            elif msg.command == Command.W_READINESS:
                answer = readiness_from_wire(msg.header)
                state.own_readiness = True
                self.readiness.answered(state, identity, answer.ready)
        except (ProtocolError, ServerError) as exc:
            log.error("event=bad_worker_message worker=%s error=%r", identity, str(exc))
