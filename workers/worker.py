"""The worker process: one model instance behind a DEALER socket.

It loads its model, says READY, then runs each EXECUTE it receives and answers with a RESULT. It exits
on SHUTDOWN, on SIGTERM, or when the broker that started it is gone.

Look-ahead (GPU instances whose model sets ``gpu_prefetch``, see ``zinfer.workers.device.prefetch_wanted``):
the worker says READY twice, which gives it a second place in the broker's list of idle instances, so the
broker may send the next batch while this one runs. Messages are taken in order from a small queue; while
the device waits for a batch, its ``on_wait`` hook reads the socket, and when the next message is an
EXECUTE it maps that batch's inputs and stages their host-to-device copies (``zinfer.workers.gpu`` says
what overlaps). The staged batch is still run, answered and timed exactly as any other.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.errors import ConfigError, ProtocolError, ResourceExhausted
from zinfer.client.gc_tuning import tune_for_serving
from zinfer.client.protocol import Command, Frame, Message
from zinfer.client.transport import send_frames
from zinfer.client.worker_protocol import (
    MAX_SLOT,
    CancelRequest,
    Execute,
    LoadFailed,
    WorkerReady,
    WorkerResult,
    cancel_from_wire,
    decode_execute,
    drop_region_from_wire,
    execute_from_wire,
    load_failed_to_wire,
    ready_to_wire,
)
from zinfer.modelconfig.autocomplete import complete_config
from zinfer.modelconfig.repository import read_model_dir_config
from zinfer.modelconfig.signature import Signature

from .batch_io import batch_request, error_result, request_arrays
from .device import CPU, Device, open_device, prefetch_wanted
from .device_wait import DeviceWait
from .heartbeat import Heartbeat
from .loader import load_model
from .model import AnyModel
from .regions import RegionCache
from .runners import Reply, Runner, runner_for
from .runtime import WorkerRuntime, install
from .sequence_state import ImplicitStates, state_specs
from .side_work import SideWork
from .triton_model import executes_async
from .warmup import run_warmup
from .worker_socket import Waiter, readable, recv_buffers

log = logging.getLogger(__name__)

POLL_MS = 500
CONCURRENT_PLACES = MAX_SLOT
"""Batches of a model's ``async def execute`` one instance runs at once (its broker places)."""


@dataclass(frozen=True)
class WorkerArgs:
    endpoint: str
    repository: Path
    model: str
    version: int
    instance: int
    device: str
    identity: bytes
    parent: int
    heartbeat_s: float = 1.0
    liveness: int = 5
    server_url: str | None = None  # the server's client socket, for BLS calls
    max_frame_bytes: int = -1  # MAXMSGSIZE of the broker's sockets: no frame over it is sent or received


class Worker:
    def __init__(
        self, args: WorkerArgs, *, tune_gc: bool = False, runtime: WorkerRuntime | None = None
    ) -> None:
        self.args = args
        self.runtime = (
            runtime if runtime is not None else WorkerRuntime()
        )  # flags, model threads, BLS, metrics
        self.regions = RegionCache(owner=args.parent)
        self.device: Device = CPU
        self.states: ImplicitStates | None = None  # a stateful model's implicit sequence state
        self.prefetch = False  # look ahead: a second batch may come while one runs (GPU only)
        self._pending: deque[Message] = deque()  # received, not yet handled, in order
        self._staged_batch: object = None  # the batch id last looked at for staging
        self._stop = False
        self.side = SideWork(
            self.runtime
        )  # async decoupled batches still running, the model's is_ready() answers
        self.tune_gc = tune_gc  # tune the collector once loaded (gc_tuning): only where this is the process
        self._ctx = zmq.Context()
        self.sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, args.identity)
        self.sock.setsockopt(zmq.LINGER, 2000)
        # an EXECUTE's inline frames are the requests' own tensors, each within the broker's tensor limit
        self.sock.setsockopt(zmq.MAXMSGSIZE, args.max_frame_bytes)
        # the idle loop blocks in recv, not in poll: one call per message, woken by it or after POLL_MS
        self.sock.setsockopt(zmq.RCVTIMEO, POLL_MS)
        self.sock.connect(args.endpoint)
        self.heartbeat = Heartbeat(self._ctx, args.endpoint, args.identity, args.heartbeat_s, args.liveness,
                                   self.runtime.metrics)  # fmt: skip
        self.heartbeat.start()

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def send(self, command: Command, header: dict[str, Any], frames: list[Frame] | None = None) -> None:
        send_frames(self.sock, protocol.encode(command, header, frames or ()))

    def send_result(self, result: WorkerResult, frames: list[Frame]) -> None:
        """A RESULT; one whose inline outputs pass the broker's frame limit (which would drop this worker's
        connection) fails its requests instead, with ResourceExhausted."""
        limit = self.args.max_frame_bytes
        big = 0
        for f in frames if limit >= 0 else ():  # the largest (no list of sizes, no view made of a view)
            n = len(f) if type(f) is bytes else f.nbytes if type(f) is memoryview else memoryview(f).nbytes
            big = max(big, n)
        if 0 <= limit < big:
            error = ResourceExhausted(
                f"an output of {big} bytes is over the {limit} byte frame limit; raise --max-tensor-bytes, "
                "or give the output a shared-memory slot"
            )
            result = result._replace(results=tuple(error_result(r.id, error) for r in result.results))
            frames = []
        # the record itself is the header: msgspec writes it as the map ``result_to_wire`` builds (fields at
        # their defaults left out, which every reader of a RESULT takes as those defaults), without the
        # dicts of every request and tensor built first
        send_frames(self.sock, protocol.encode(Command.W_RESULT, result, frames))

    def load(self) -> tuple[Signature, AnyModel, Runner] | None:
        a = self.args
        try:
            config = read_model_dir_config(a.repository / a.model)  # config.pbtxt, or what model.py implies
            config = complete_config(config, a.repository / a.model, a.version)
            self.runtime.bls.configure(a.server_url, a.model, sum(g.count for g in config.instance_group))
            self.device = open_device(a.device)
            self.heartbeat.device_bytes = getattr(self.device, "memory_used", None)
            threads = self.runtime.threads
            threads.configure(_device_setup(self.device))
            self.regions.pinner = self.device
            model = load_model(
                config, a.repository / a.model / str(a.version), self.device, a.instance, threads
            )
            run_warmup(config, model, a.repository / a.model, self.device)  # model_warmup, before READY
            if self.heartbeat.device_bytes is not None:
                self.heartbeat.report_now()  # the device memory the model holds, before READY
            self.prefetch = prefetch_wanted(config, model, self.device)
            specs = state_specs(config, a.repository / a.model / str(a.version))
            self.states = ImplicitStates(specs, config.max_batch_size > 0) if specs else None
        except (Exception, SystemExit) as exc:
            # our own load errors already name the model or file; anything else gets its type
            error = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            # the broker logs the model's load failure once, with this text (event=model_load_failed)
            log.debug("event=load_failed model=%s version=%d error=%r", a.model, a.version, error)
            self.send(Command.W_LOAD_FAILED, load_failed_to_wire(LoadFailed(error)))
            return None
        sig = Signature.of(config)
        return (
            sig,
            model,
            runner_for(model, sig, self.regions, self.device, self.states, self.runtime, self.side),
        )

    def serve(self) -> int:
        loaded = self.load()
        if loaded is None:
            self.close()
            return 1
        _, model, runner = loaded
        a = self.args
        ready = WorkerReady(a.model, a.version, a.instance, a.device, os.getpid())
        self.send(Command.W_READY, ready_to_wire(ready))
        self.side.watch_readiness(model, a.model)  # the model's own is_ready(), if it has one
        if executes_async(model):  # Triton runs an async execute's batches side by side
            for slot in range(2, CONCURRENT_PLACES + 1):
                self.send(Command.W_READY, ready_to_wire(replace(ready, slot=slot)))
            log.info("event=async_execute model=%s places=%d", a.model, CONCURRENT_PLACES)
        if self.prefetch:
            self.device.on_wait = self._look_ahead
            self.send(Command.W_READY, ready_to_wire(replace(ready, slot=2)))  # a second idle place
            log.info("event=gpu_prefetch model=%s instance=%d", a.model, a.instance)
        if self.tune_gc:  # the model is loaded and warm: freeze its heap, collect less often (gc_tuning)
            tune_for_serving()
        log.info(
            "event=worker_ready model=%s version=%d instance=%d pid=%d",
            a.model,
            a.version,
            a.instance,
            os.getpid(),
        )
        try:
            while not self._stop:
                if self.side:
                    self.side.tend(self.send, self.send_result)
                if self._pending:
                    msg = self._pending.popleft()
                elif self.side and not self.side.wait(self.sock, POLL_MS):  # also woken by its side work
                    if os.getppid() != a.parent:
                        log.warning("event=broker_gone model=%s", a.model)
                        break
                    continue
                else:
                    try:
                        received = self._receive()  # waits up to POLL_MS (RCVTIMEO)
                    except zmq.Again:
                        if os.getppid() != a.parent:
                            log.warning("event=broker_gone model=%s", a.model)
                            break
                        continue
                    if received is None:
                        continue
                    msg = received
                if msg.command == Command.W_SHUTDOWN:
                    break
                try:
                    if msg.command == Command.W_EXECUTE:
                        self._execute(runner, execute_from_wire(msg.record_or_header), msg.frames)
                    elif msg.command == Command.W_DROP_REGION:
                        self.regions.drop(drop_region_from_wire(msg.header).name)
                    elif msg.command == Command.W_CANCEL:
                        self._cancel(cancel_from_wire(msg.header))
                    elif msg.command == Command.W_CHECK_READY and self.side.readiness is not None:
                        self.side.readiness.start()
                except ProtocolError as exc:
                    log.error("event=bad_message command=%s error=%r", msg.command.name, str(exc))
        finally:
            try:
                model.finalize()
            except Exception:
                log.exception("event=finalize_failed model=%s", a.model)
            self.close()
        return 0

    def _receive(self) -> Message | None:
        """The next message, None when it is malformed (logged); waits up to POLL_MS (the socket's
        RCVTIMEO) for one, then raises ``zmq.Again`` (callers that polled first never wait)."""
        buffers = recv_buffers(self.sock)
        try:  # an EXECUTE straight from its bytes; anything else (or a malformed one) through the map
            return decode_execute(buffers) or protocol.decode(buffers)
        except ProtocolError as exc:
            log.error("event=bad_message error=%r", str(exc))
            return None

    def _look_ahead(self, wait: DeviceWait) -> None:
        """The device's ``on_wait``: read the socket until the device is done, asleep in ``poll`` on the
        socket and the device's wake-up descriptor (never spinning); stage a batch that came."""
        waiter = Waiter(self.sock, wait.fd)
        while True:
            if self._pending:
                self._stage(self._pending[0])
                return
            if wait.done():
                return
            if waiter.wait(POLL_MS)[0]:
                received = self._receive()
                if received is not None:
                    self._pending.append(received)

    def _stage(self, msg: Message) -> None:
        """Map an EXECUTE's inputs and start their copies to the device (each batch once). A batch that
        cannot be staged is left alone: running it reports whatever is wrong with it."""
        if msg.command != Command.W_EXECUTE:
            return
        try:
            execute = execute_from_wire(msg.record_or_header)
        except ProtocolError:
            return  # running it reports the error
        batch_id = execute.batch
        if batch_id == self._staged_batch or execute.serial:  # a run's requests are not one batch
            return
        self._staged_batch = batch_id
        try:
            per_name: dict[str, list[Any]] = {}
            self.regions.use_table(execute.regions)
            self.regions.begin_batch()  # sizes are checked afresh for the staged batch
            for r in execute.requests:
                arrays = request_arrays(batch_request(r), msg.frames, self.regions)
                for name, arr in arrays.items():
                    per_name.setdefault(name, []).append(arr)
            nbytes = self.device.stage(batch_id, list(per_name.values()))
        except Exception as exc:
            log.debug("event=stage_skipped batch=%s error=%r", batch_id, exc)
            return
        log.debug("event=staged batch=%s bytes=%d", batch_id, nbytes)

    def _execute(self, runner: Runner, execute: Execute, frames: list[Frame]) -> None:
        """Run one EXECUTE with the model's runner; :class:`Reply` answers it on every way out."""
        batch_id = execute.batch
        requests = [batch_request(r) for r in execute.requests]
        with Reply(batch_id, requests, self.send_result) as reply:
            if self.prefetch:  # only a worker that looks ahead stages a batch's copies
                self.device.take_staged(batch_id)
            self.regions.use_table(execute.regions)
            self.runtime.cancels.begin_batch(batch_id, [r.id for r in requests])
            reply.outcome = runner.run(batch_id, execute.serial, requests, frames, reply)

    def _cancel(self, cancel: CancelRequest) -> None:
        if self.runtime.cancels.cancel(cancel.batch, cancel.id):
            log.info("event=request_cancelled batch=%d request=%d", cancel.batch, cancel.id)

    def _pump(self, done: Callable[[], bool]) -> bool:
        """Wait for ``done()`` while the model runs on its own threads: read the socket (a CANCEL sets its
        request's flag at once; anything else waits its turn in ``_pending``) and wake whenever the runtime's
        ``threads.wake`` is set. False when the worker is to stop (SHUTDOWN, SIGTERM, broker gone)."""
        wake = self.runtime.threads.wake
        waiter = Waiter(self.sock, wake.fd)
        while not done():
            if self._stop:
                return False
            if self.side:
                self.side.tend(self.send, self.send_result)
            message, woken = waiter.wait(POLL_MS)
            if woken:
                wake.clear()
            if message:
                if not self._take_while_busy():
                    return False
            elif not woken and os.getppid() != self.args.parent:
                return False
        return True

    def _take_while_busy(self) -> bool:
        """Read one message while a model runs: a CANCEL sets its request's flag now, anything else waits
        its turn in ``_pending``. False when it was a SHUTDOWN."""
        msg = self._receive()
        if msg is None:
            return True
        if msg.command == Command.W_CANCEL:
            try:
                self._cancel(cancel_from_wire(msg.header))
            except ProtocolError as exc:
                log.error("event=bad_message command=W_CANCEL error=%r", str(exc))
            return True
        self._pending.append(msg)
        return msg.command != Command.W_SHUTDOWN

    def _poll_cancels(self) -> None:
        """The cancel flags' hook while a model's ``execute`` runs on this thread: take what has arrived
        (bounded, without waiting), so a CANCEL sent meanwhile sets its flag before the model reads it."""
        for _ in range(64):
            if not readable(self.sock) or not self._take_while_busy():
                return

    def close(self) -> None:
        self.runtime.close()
        self.heartbeat.stop()
        self.regions.close()
        try:
            self.device.close()
        except Exception as exc:
            log.warning("event=device_close_failed error=%r", exc)
        self.sock.close()
        self._ctx.term()


def _device_setup(device: Device) -> Callable[[], None] | None:
    """What the model's threads run first: a GPU instance makes its device current there too."""
    if device.is_host:
        return None

    def use_device() -> None:
        try:
            import cupy

            cupy.cuda.Device(device.id).use()
        except Exception as exc:  # the model's own code then picks its device itself
            log.warning("event=model_thread_device_failed device=%s error=%r", device.id, exc)

    return use_device


def main_loop(args: WorkerArgs) -> int:
    runtime = WorkerRuntime()
    install(runtime)  # what the model-facing API (pb_utils, workers.bls, MetricFamily) reaches
    worker = Worker(args, tune_gc=True, runtime=runtime)  # this process is the worker (not a test's)
    runtime.threads.set_pump(worker._pump)
    runtime.cancels.set_poll(worker._poll_cancels)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the broker stops us
    signal.signal(signal.SIGTERM, worker.request_stop)
    started = time.monotonic()
    code = worker.serve()
    log.debug("event=worker_exit code=%d uptime_s=%.1f", code, time.monotonic() - started)
    return code
