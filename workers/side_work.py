"""What a worker tends between messages besides its socket: batches of an ``async def execute`` still
running (a decoupled model's, ``triton_stream.StreamRun``: their responses go out as their senders queue
them, their RESULT when every request has ended; any other's, ``async_requests.AsyncRequestRun``: its RESULT
when its coroutine has returned) and the model's own ``is_ready()`` answers
(``readiness.ReadinessCheck``). Both wake the worker through the runtime's ``threads.wake``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import zmq

from zinfer.client.protocol import Command, Frame
from zinfer.client.worker_protocol import Readiness, WorkerResult, readiness_to_wire

from .batch_io import BatchOutcome
from .readiness import ReadinessCheck
from .runtime import WorkerRuntime
from .worker_socket import Waiter

SendResult = Callable[[WorkerResult, list[Frame]], None]
Send = Callable[[Command, dict[str, Any]], None]


class SideRun(Protocol):
    """A batch that runs on beside the next ones."""

    def step(self) -> bool:
        """Send what is due now; True when the batch has ended."""
        ...

    def finish(self) -> BatchOutcome:
        """Its outcome, once ended: every request answered."""
        ...


class SideWork:
    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.runs: dict[int, SideRun] = {}  # by batch id
        self.readiness: ReadinessCheck | None = None
        self._waiter: Waiter | None = None  # the socket and the wake, polled together (made once)

    def __bool__(self) -> bool:
        """Whether anything besides the socket may wake the worker."""
        return bool(self.runs) or self.readiness is not None

    def watch_readiness(self, model: Any, name: str) -> None:
        """Call the model's own is_ready() now, if it has one (and again when the broker asks)."""
        self.readiness = ReadinessCheck.of(model, name, self.runtime.threads)
        if self.readiness is not None:
            self.readiness.start()

    def keep(self, batch_id: int, run: SideRun) -> None:
        """A batch that runs on beside the next ones."""
        self.runtime.cancels.keep_batch(batch_id)
        self.runs[batch_id] = run

    def tend(self, send: Send, send_result: SendResult) -> None:
        """Send what the running batches queued (and the RESULT of those that ended), and a new answer of
        the model's is_ready()."""
        for batch_id, run in list(self.runs.items()):
            if run.step():
                del self.runs[batch_id]
                self.runtime.cancels.end_batch(batch_id)
                outcome = run.finish()
                timings = (outcome.input_ns, outcome.infer_ns, outcome.output_ns)
                send_result(WorkerResult(batch_id, tuple(outcome.results), timings=timings), outcome.frames)
        answer = self.readiness.take() if self.readiness is not None else None
        if answer is not None:
            send(Command.W_READINESS, readiness_to_wire(Readiness(answer)))

    def wait(self, sock: zmq.Socket[bytes], timeout_ms: int) -> bool:
        """Wait for a message or a wake-up; True when a message came."""
        wake = self.runtime.threads.wake
        waiter = self._waiter
        if waiter is None or waiter.sock is not sock or waiter.fd != wake.fd:
            waiter = self._waiter = Waiter(sock, wake.fd)
        message, woken = waiter.wait(timeout_ms)
        if woken:
            wake.clear()
        return message
