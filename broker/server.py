"""The broker: a client ROUTER, a worker ROUTER, one batcher per model, and the supervisor.

The loop follows the Majordomo pattern: poll with a deadline (the nearest batch deadline, capped so
process checks and stop requests are noticed), handle what arrived, then dispatch ready batches to idle
instances and reap dead workers after every wake-up.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.errors import (
    InvalidArgument,
    NotFound,
    ProtocolError,
    ServerError,
    Status,
    Unavailable,
)
from zinfer.client.paths import LOCK_NAME, SOCKET_NAME, WORKER_SOCKET_NAME, client_endpoint, worker_endpoint
from zinfer.client.protocol import Command, Frame, Reply
from zinfer.client.transport import NOBLOCK, send_frames

from .batcher import Batch, QueuedRequest
from .handlers import ClientHandlers
from .model_state import InFlight, ModelState, Pending
from .regions import RegionTable
from .repository import scan_repository
from .supervisor import Supervisor, WorkerSpec
from .validation import DEFAULT_MAX_TENSOR_BYTES

log = logging.getLogger(__name__)

MAX_POLL_MS = 100
REAP_INTERVAL_S = 0.05
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path
    runtime_dir: Path
    tcp: str | None = None
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES
    exit_timeout_s: float = 5.0
    log_level: str = "INFO"


class AlreadyRunning(ServerError):
    status = Status.ALREADY_EXISTS


class Broker:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.regions = RegionTable()
        self.models: dict[str, dict[int, ModelState]] = {}
        self.load_errors: dict[str, str] = {}
        self.supervisor = Supervisor(options.log_level)
        self.inflight: dict[int, InFlight] = {}
        self.worker_model: dict[bytes, ModelState] = {}
        self._seq = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._restarts: dict[tuple[str, int, int], list[float]] = {}
        self._pending_spawns: list[tuple[float, WorkerSpec]] = []
        self._ready_logged = False
        self._next_reap = 0.0
        self._ctx = zmq.Context()
        self._lock_fd = -1
        self.frontend: zmq.Socket[bytes] | None = None
        self.backend: zmq.Socket[bytes] | None = None
        self.handlers = ClientHandlers(self)

    # ------------------------------------------------------------------------------------ start / stop

    def start(self) -> None:
        rt = self.options.runtime_dir
        rt.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(rt, 0o700)
        self._take_lock(rt)
        for name in (SOCKET_NAME, WORKER_SOCKET_NAME):
            (rt / name).unlink(missing_ok=True)
        self.frontend = self._router(client_endpoint(rt))
        if self.options.tcp:
            self.frontend.bind(f"tcp://{self.options.tcp}")
        self.backend = self._router(worker_endpoint(rt))
        os.chmod(rt / SOCKET_NAME, 0o600)
        os.chmod(rt / WORKER_SOCKET_NAME, 0o600)
        self._load_repository()
        log.info("event=listening endpoint=%s tcp=%s", client_endpoint(rt), self.options.tcp or "off")

    def _take_lock(self, rt: Path) -> None:
        fd = os.open(rt / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise AlreadyRunning(f"another zinfer server is running on {rt}") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _router(self, endpoint: str) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)
        sock.bind(endpoint)
        return sock

    def _load_repository(self) -> None:
        for entry in scan_repository(self.options.model_repository):
            if entry.error is not None or entry.config is None:
                self.load_errors[entry.name] = entry.error or "invalid model"
                log.error("event=model_load_failed model=%s error=%r", entry.name, entry.error)
                continue
            versions = self.models.setdefault(entry.name, {})
            for version in entry.versions:
                devices = self._devices(entry.config)
                state = ModelState(entry.config, version, entry.path / str(version), len(devices))
                versions[version] = state
                if isinstance(devices, str):
                    state.error = devices
                    log.error("event=model_load_failed model=%s error=%r", entry.name, devices)
                    continue
                for instance, device in enumerate(devices):
                    self._spawn(
                        WorkerSpec(
                            entry.name,
                            version,
                            instance,
                            device,
                            self.options.model_repository,
                            worker_endpoint(self.options.runtime_dir),
                        )
                    )

    @staticmethod
    def _devices(config: Any) -> list[str] | str:
        """One device per instance, or an error text when the instance groups cannot be placed."""
        devices: list[str] = []
        for group in config.instance_group or ():
            if group.kind == "KIND_GPU":
                return "instance_group kind KIND_GPU is not supported yet (no GPU workers in this build)"
            devices.extend(["cpu"] * group.count)
        return devices or ["cpu"]

    def _spawn(self, spec: WorkerSpec) -> None:
        wp = self.supervisor.spawn(spec)
        self.worker_model[wp.identity] = self.models[spec.model][spec.version]

    def close(self) -> None:
        """Fail what is queued, stop the workers, close and remove the sockets."""
        for versions in self.models.values():
            for state in versions.values():
                for p in state.batcher.remove(lambda _: True):
                    self._reply_error(p, Unavailable("the server is shutting down"))
        for batch in list(self.inflight.values()):
            for p in batch.requests:
                self._reply_error(p, Unavailable("the server is shutting down"))
        self.inflight.clear()
        if self.backend is not None:
            for identity in list(self.worker_model):
                self._send_worker(identity, Command.W_SHUTDOWN, {})
        self.supervisor.stop_all(self.options.exit_timeout_s)
        for sock in (self.frontend, self.backend):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.destroy(linger=0)
        rt = self.options.runtime_dir
        if self._lock_fd >= 0:  # only the server holding the lock owns the socket files
            for name in (SOCKET_NAME, WORKER_SOCKET_NAME):
                (rt / name).unlink(missing_ok=True)
            (rt / LOCK_NAME).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("event=stopped")

    # ------------------------------------------------------------------------------------ loop

    def run(self, should_stop: Callable[[], bool]) -> None:
        assert self.frontend is not None and self.backend is not None
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        while not should_stop():
            timeout_ms = self._poll_timeout_ms()
            if timeout_ms < 1.0:  # zmq polls in whole milliseconds: sleep the sub-millisecond rest
                time.sleep(timeout_ms / 1000)
            events = dict(poller.poll(int(timeout_ms)))
            if self.backend in events:
                self._drain(self.backend, self._on_worker)
            if self.frontend in events:
                self._drain(self.frontend, self._on_client)
            now = time.monotonic()
            if now >= self._next_reap:
                self._next_reap = now + REAP_INTERVAL_S
                self._reap(now)
            self._dispatch(now)
            self._log_ready_once()

    def _drain(self, sock: zmq.Socket[bytes], handle: Callable[[bytes, list[Frame]], None]) -> None:
        for _ in range(256):  # bounded, so one busy socket cannot starve the other
            frames = sock.recv_multipart(copy=False)
            handle(frames[0].bytes, [f.buffer for f in frames[1:]])
            if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                return

    def _poll_timeout_ms(self) -> float:
        """Milliseconds until the nearest batch deadline of a model with an idle instance (capped)."""
        deadline: float | None = None
        for versions in self.models.values():
            for state in versions.values():
                if state.idle:
                    d = state.batcher.next_deadline()
                    if d is not None and (deadline is None or d < deadline):
                        deadline = d
        if deadline is None:
            return float(MAX_POLL_MS)
        return max(0.0, min(float(MAX_POLL_MS), (deadline - time.monotonic()) * 1000))

    def _log_ready_once(self) -> None:
        if self._ready_logged or any(s.loading for v in self.models.values() for s in v.values()):
            return
        self._ready_logged = True
        states = [s for v in self.models.values() for s in v.values()]
        ready = sorted(f"{s.name}:{s.version}" for s in states if s.ready)
        failed = sorted(f"{s.name}:{s.version}" for s in states if s.error) + sorted(self.load_errors)
        log.info("event=ready models=%s failed=%s", ",".join(ready) or "-", ",".join(failed) or "-")

    @property
    def startup_done(self) -> bool:
        return self._ready_logged

    # ------------------------------------------------------------------------------------ clients

    def _on_client(self, identity: bytes, frames: list[Frame]) -> None:
        try:
            msg = protocol.decode(frames, protocol.CLIENT_COMMANDS)
        except ProtocolError as exc:
            log.warning("event=bad_client_message error=%r", str(exc))
            self._send_client(identity, Reply("", Status.INVALID_ARGUMENT, f"ProtocolError: {exc}"))
            return
        rid = protocol.request_id_of(msg.header)
        try:
            if msg.command == Command.INFER:
                self._on_infer(identity, msg.header, msg.frames)
                return
            body = self.handlers.handle(identity, msg.command, msg.header)
        except ProtocolError as exc:
            self._send_client(identity, Reply(rid, Status.INVALID_ARGUMENT, f"InvalidArgument: {exc}"))
            return
        except ServerError as exc:
            self._send_client(identity, Reply(rid, exc.status, exc.wire_text()))
            return
        except Exception as exc:  # a handler bug must never take the broker down
            log.exception("event=handler_failed command=%s", msg.command.name)
            self._send_client(identity, Reply(rid, Status.INTERNAL, f"InternalError: {type(exc).__name__}"))
            return
        self._send_client(identity, Reply(rid, Status.OK, body=body))

    def resolve(self, name: str, version: int) -> ModelState:
        versions = self.models.get(name)
        if not versions:
            if name in self.load_errors:
                raise Unavailable(f"model '{name}' failed to load: {self.load_errors[name]}")
            raise NotFound(f"unknown model '{name}'")
        if version:
            state = versions.get(version)
            if state is None:
                raise NotFound(f"unknown version {version} of model '{name}'")
            return state
        ready = [v for v, s in versions.items() if s.ready]
        return versions[max(ready) if ready else max(versions)]

    def _on_infer(self, identity: bytes, header: dict[str, Any], frames: list[Frame]) -> None:
        from .validation import check_request

        req = protocol.infer_from_wire(header)
        state = self.resolve(req.model, req.version)
        if not state.ready:
            reason = state.error or "no instance is ready yet"
            raise Unavailable(f"model '{state.name}' version {state.version} is not ready: {reason}")
        checked = check_request(
            req, frames, state.signature, self.regions, identity, self.options.max_tensor_bytes
        )
        now = time.monotonic()
        outputs = (
            header["outputs"]
            if req.outputs is not None
            else [protocol.output_to_wire(o) for o in checked.outputs]
        )
        pending = Pending(
            next(self._seq), identity, req, frames, header["inputs"], outputs, checked.batch_size, now
        )
        state.batcher.add(QueuedRequest(pending, checked.batch_size, checked.shape_key, now), now)

    def _send_client(self, identity: bytes, reply: Reply, frames: list[Frame] | None = None) -> None:
        assert self.frontend is not None
        msg = protocol.encode(Command.REPLY, protocol.reply_to_wire(reply), frames or ())
        try:
            send_frames(self.frontend, [identity, *msg], NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone or not reading: count it, never block the loop
            log.warning("event=reply_undeliverable request=%s error=%r", reply.request_id, exc.strerror)

    def _reply_error(self, p: Pending, exc: ServerError) -> None:
        self._send_client(p.client, Reply(p.request.request_id, exc.status, exc.wire_text()))

    # ------------------------------------------------------------------------------------ workers

    def _on_worker(self, identity: bytes, frames: list[Frame]) -> None:
        try:
            msg = protocol.decode(frames, protocol.WORKER_COMMANDS)
        except ProtocolError as exc:
            log.warning("event=bad_worker_message worker=%s error=%r", identity, str(exc))
            return
        state = self.worker_model.get(identity)
        if state is None:
            log.warning("event=unknown_worker worker=%s", identity)
            self._send_worker(identity, Command.W_SHUTDOWN, {})
            return
        try:
            if msg.command == Command.W_READY:
                state.instances.add(identity)
                state.idle.append(identity)
                log.info(
                    "event=instance_ready model=%s version=%d worker=%s pid=%s",
                    state.name,
                    state.version,
                    identity.decode(),
                    msg.header.get("pid"),
                )
            elif msg.command == Command.W_LOAD_FAILED:
                state.error = str(msg.header.get("error", "unknown error"))
                log.error(
                    "event=model_load_failed model=%s version=%d error=%r",
                    state.name,
                    state.version,
                    state.error,
                )
            elif msg.command == Command.W_RESULT:
                self._on_result(identity, state, msg.header, msg.frames)
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            log.error("event=bad_worker_message worker=%s error=%r", identity, str(exc))

    def _on_result(
        self, identity: bytes, state: ModelState, header: dict[str, Any], frames: list[Frame]
    ) -> None:
        batch = self.inflight.pop(int(header["batch"]), None)
        if batch is None or batch.worker != identity:
            log.warning("event=stale_result worker=%s", identity)
            return
        by_seq = {p.seq: p for p in batch.requests}
        timing = header.get("t", [0, 0, 0])
        stats = state.stats
        stats.compute_input.add(int(timing[0]))
        stats.compute_infer.add(int(timing[1]))
        stats.compute_output.add(int(timing[2]))
        now_ns = time.monotonic_ns()
        for res in header["results"]:
            p = by_seq.pop(int(res["id"]), None)
            if p is None:
                continue
            duration = now_ns - int(p.arrival * 1e9)
            if int(res.get("status", 0)) == 0:
                stats.success.add(duration)
                stats.inference_count += p.batch_size
                outputs, out_frames = _renumber(res.get("outputs", []), frames)
                body = {"model": state.name, "version": state.version, "outputs": outputs}
                self._send_client(p.client, Reply(p.request.request_id, Status.OK, body=body), out_frames)
            else:
                stats.fail.add(duration)
                self._send_client(
                    p.client,
                    Reply(p.request.request_id, Status(int(res["status"])), str(res.get("error", ""))),
                )
        for p in by_seq.values():  # a worker that forgot a request must not leave its client hanging
            self._reply_error(p, Unavailable("the worker returned no result for this request"))
        stats.last_inference_ms = int(time.time() * 1000)
        if identity in state.instances:
            state.idle.append(identity)

    def _send_worker(
        self, identity: bytes, command: Command, header: dict[str, Any], frames: list[Frame] | None = None
    ) -> bool:
        assert self.backend is not None
        try:
            send_frames(self.backend, [identity, *protocol.encode(command, header, frames or ())], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            log.warning("event=worker_unreachable worker=%s error=%r", identity, exc.strerror)
            return False

    def _dispatch(self, now: float) -> None:
        for versions in self.models.values():
            for state in versions.values():
                if not state.idle or not len(state.batcher):
                    continue
                for batch in state.batcher.pop_ready(now, len(state.idle)):
                    self._execute(state, state.idle.popleft(), batch, now)

    def _execute(self, state: ModelState, worker: bytes, batch: Batch[Pending], now: float) -> None:
        batch_id = next(self._batch_ids)
        requests: list[dict[str, Any]] = []
        frames: list[Frame] = []
        for p in batch.items:
            state.stats.queue.add(int((now - p.arrival) * 1e9))
            inputs = p.wire_inputs
            if p.frames:  # renumber this request's inline frames into the batch's frame list
                inputs = []
                for d in p.wire_inputs:
                    if "frame" in d:
                        frames.append(p.frames[d["frame"]])
                        d = {**d, "frame": len(frames) - 1}
                    inputs.append(d)
            requests.append({"id": p.seq, "inputs": inputs, "outputs": p.wire_outputs})
        state.stats.record_batch(batch.size, batch.reason.value)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event=batch model=%s size=%d requests=%d reason=%s worker=%s",
                state.name,
                batch.size,
                len(batch.items),
                batch.reason.value,
                worker.decode(),
            )
        self.inflight[batch_id] = InFlight(batch_id, worker, state, list(batch.items), time.monotonic_ns())
        if not self._send_worker(
            worker, Command.W_EXECUTE, {"batch": batch_id, "requests": requests}, frames
        ):
            self._fail_batch(self.inflight.pop(batch_id), "the instance could not be reached")

    def _fail_batch(self, batch: InFlight, why: str) -> None:
        for p in batch.requests:
            batch.model.stats.fail.add(0)
            self._reply_error(p, Unavailable(f"model '{batch.model.name}' instance failed: {why}"))

    def _reap(self, now: float) -> None:
        for wp, code in self.supervisor.reap():
            state = self.worker_model.pop(wp.identity, None)
            if state is None:
                continue
            state.instances.discard(wp.identity)
            if wp.identity in state.idle:
                state.idle.remove(wp.identity)
            for bid, batch in list(self.inflight.items()):
                if batch.worker == wp.identity:
                    del self.inflight[bid]
                    self._fail_batch(batch, f"worker exited with code {code}")
            log.warning(
                "event=worker_exited model=%s version=%d worker=%s code=%d",
                state.name,
                state.version,
                wp.identity.decode(),
                code,
            )
            if state.error is not None:
                continue  # a load failure: do not restart
            key = (wp.spec.model, wp.spec.version, wp.spec.instance)
            recent = [t for t in self._restarts.get(key, []) if now - t < 60.0]
            if len(recent) >= len(RESTART_BACKOFF_S):
                state.error = f"worker crashed {len(recent)} times in a minute (last exit code {code})"
                log.error("event=instance_failed model=%s error=%r", state.name, state.error)
                continue
            self._restarts[key] = [*recent, now]
            self._pending_spawns.append((now + RESTART_BACKOFF_S[len(recent)], wp.spec))
        due = [s for t, s in self._pending_spawns if t <= now]
        self._pending_spawns = [(t, s) for t, s in self._pending_spawns if t > now]
        for spec in due:
            self._spawn(spec)

    def drop_region(self, name: str) -> None:
        """Tell every worker to unmap a region its client unregistered."""
        for identity in list(self.worker_model):
            self._send_worker(identity, Command.W_DROP_REGION, {"name": name})


def _renumber(outputs: list[dict[str, Any]], frames: list[Frame]) -> tuple[list[dict[str, Any]], list[Frame]]:
    """Outputs of one request with their inline frames numbered from 0 for the client."""
    out_frames: list[Frame] = []
    renumbered = []
    for t in outputs:
        if "frame" in t:
            idx = int(t["frame"])
            if not 0 <= idx < len(frames):
                raise InvalidArgument("worker result names a missing frame")
            t = {**t, "frame": len(out_frames)}
            out_frames.append(frames[idx])
        renumbered.append(t)
    return renumbered, out_frames
