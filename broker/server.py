"""The broker: a client ROUTER, a worker ROUTER, one scheduler per model, and the supervisor.

The loop follows the Majordomo pattern: poll with a deadline (the nearest batch deadline, capped so
process checks and stop requests are noticed), handle what arrived, then dispatch ready batches to idle
instances and reap dead workers after every wake-up.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import zmq

from zinfer.client import protocol
from zinfer.client.cpu_pinning import cpu_arg
from zinfer.client.errors import ProtocolError, ServerError, Status, Unavailable
from zinfer.client.paths import SOCKET_NAME, WORKER_SOCKET_NAME, client_endpoint, worker_endpoint
from zinfer.client.protocol import Command, Frame, Reply
from zinfer.client.region_handoff import HANDOFF_SOCKET_NAME
from zinfer.client.shm import reap_orphans
from zinfer.client.worker_protocol import (
    DropRegion,
    Shutdown,
    drop_region_to_wire,
    empty_to_wire,
)
from zinfer.modelconfig.repository import model_folder_names

from .admission import Admission
from .batching.rate_limiter import RateLimiter
from .cache_path import CachePath
from .completion import Completion
from .dispatcher import Dispatcher
from .drain import drain, drain_workers
from .ensemble_path import EnsemblePath
from .fd_limit import raise_fd_limit
from .handlers import LATER, QUERIES, Controls, Queries
from .instance_pool import InstancePool
from .limited_dispatch import LimitedDispatch, ModelKey
from .model_control import ModelControl
from .model_state import ModelState
from .observer import Observer
from .on_demand import OnDemand
from .outbox import IPC_TAG, TCP_TAG, Outbox
from .precise_wait import PreciseWait, tighten_timer_slack
from .queues import Queues
from .region_intake import RegionIntake
from .regions import Region, RegionTable
from .registry import ModelRegistry
from .runtime_dir import RuntimeDir
from .server_config import cpus_for
from .server_options import ServerOptions
from .startup_log import StartupLog
from .supervisor import RestartPolicy, Supervisor, WorkerSpec
from .tcp_access import TcpFrontend
from .worker_inbox import WorkerInbox
from .worker_watch import WorkerWatch

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.05
REGION_REAP_INTERVAL_S = 2.0


class Broker:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.regions = RegionTable(options.max_region_bytes, max_uid_bytes=options.max_user_region_bytes)
        self.registry = ModelRegistry(options.gpus)
        self.supervisor = Supervisor(
            options.log_level,
            options.heartbeat_interval_s,
            options.heartbeat_liveness,
            client_endpoint(options.runtime_dir),
            max_frame_bytes=protocol.frame_limit(options.max_tensor_bytes),
        )
        # which worker serves which model, its places, its batches, its heartbeats
        self.pool = InstancePool(options.heartbeat_interval_s * options.heartbeat_liveness)
        self.outbox = Outbox(options.max_unread_reply_bytes)  # what the collaborators send through
        self.caching = CachePath(options.cache_bytes, self.regions.map_readonly)
        self.observer = Observer(self.registry, self.regions, self.caching, self.pool, self.supervisor,
                                 self.serving_ready, options.trace)  # fmt: skip
        tracer = self.observer.tracer  # per-request traces
        # a request's path, each part built with what it uses: completion, dispatch, queueing, ensembles
        self.limiter: RateLimiter[bytes, ModelKey] = RateLimiter(options.rate_limit_resources)
        states = self.registry.states
        self.completion = Completion(self.pool, self.outbox, self.caching, self.limiter, states, tracer)
        self.dispatcher = Dispatcher(
            self.registry, self.regions, self.pool, self.outbox, self.completion, self.limiter,
            LimitedDispatch(self.limiter, self.pool, self.supervisor, self.completion),
        )  # fmt: skip
        self.queues = Queues(self.registry, self.caching, self.completion, self.pool)
        self.ensembles = EnsemblePath(self.registry, self.regions, self.queues, self.completion, self.caching,
                                      tracer, options.max_tensor_bytes)  # fmt: skip
        self.admission = Admission(
            self.registry, self.regions, self.queues, self.ensembles, self.dispatcher, self.completion,
            self.caching, self.pool, tracer, lambda: self.draining_since is not None,
            options.max_tensor_bytes, options.max_batch_bytes,
        )  # fmt: skip
        custom = self.observer.metrics.custom
        self.worker_inbox = WorkerInbox(self.pool, self.outbox, self.completion, self.dispatcher, custom)
        self.restarts = RestartPolicy()
        self._ready_logged = False
        # the start's progress lines and ready line; ``zinfer serve`` adds the front doors to ``where``
        self.startup = StartupLog(time.monotonic())
        self._next_reap = 0.0
        self.draining_since: float | None = None
        self.watch = WorkerWatch(self.pool, self.supervisor, self.restarts, self.completion, self.spawn)
        self._next_region_reap = 0.0
        self._ctx = zmq.Context()
        self.runtime = RuntimeDir(options.runtime_dir)
        self.intake: RegionIntake | None = None  # where local clients hand over their segments
        self.frontend: zmq.Socket[bytes] | None = None
        self.tcp: TcpFrontend | None = None
        self.backend: zmq.Socket[bytes] | None = None
        self.control = ModelControl(
            options, self.registry, self.pool, self.outbox, self.observer.attach, self.start_instances,
            self.limiter,
        )
        od = self.on_demand = OnDemand.of(self) if options.model_control_mode == "on-demand" else None
        self.queries = Queries(self.registry, od.status if od else self.observer.status,
                               od.index if od else self.control.index, self.serving_ready,
                               self.worker_inbox.readiness.ask)  # fmt: skip
        self.controls = Controls(
            od.cancel if od else self.admission.cancel, self.regions, lambda: self.intake, self.drop_region,
            self.control.load, self.control.unload, self.observer.tracer)  # fmt: skip
        self._spec_state: dict[WorkerSpec, ModelState] = {}

    # ------------------------------------------------------------------------------------ start / stop

    def start(self) -> None:
        rt = self.options.runtime_dir
        self.runtime.claim()
        raise_fd_limit()
        reaped = reap_orphans()
        if reaped:
            log.info("event=stale_segments_reaped count=%d", len(reaped))
        self.frontend = self._router(client_endpoint(rt))
        if self.options.tcp:
            o = self.options
            self.tcp = TcpFrontend(self._ctx, o.tcp, o.curve_secret_key, o.curve_allow,  # type: ignore[arg-type]
                                   protocol.frame_limit(o.max_tensor_bytes))  # fmt: skip
        self.backend = self._router(worker_endpoint(rt))
        self.outbox.attach(self.frontend, self.backend, self.tcp.sock if self.tcp is not None else None)
        os.chmod(rt / SOCKET_NAME, 0o600)
        os.chmod(rt / WORKER_SOCKET_NAME, 0o600)
        if self.options.socket_group:
            self.runtime.share_with_group(self.options.socket_group)
        self.intake = RegionIntake(rt / HANDOFF_SOCKET_NAME, self.options.max_region_bytes)
        self.intake.like(rt / SOCKET_NAME)
        if self.options.metrics:  # before any model loads: a taken port fails the start at once
            self.observer.start_http(self.options.metrics)
        log.info("event=listening endpoint=%s tcp=%s", client_endpoint(rt), self.options.tcp or "off")
        http = self.observer.http
        metrics = f"http://{http.host}:{http.port}/metrics" if http is not None else "off"
        self.startup.where = {"socket": client_endpoint(rt), "tcp": self.options.tcp or "off",
                              **self.startup.where, "metrics": metrics}  # fmt: skip
        self.startup.restart(time.monotonic())
        self._load_repository()

    def _router(self, endpoint: str) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # no frame over a tensor's size limit is ever buffered: libzmq drops a peer that announces one
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.frame_limit(self.options.max_tensor_bytes))
        sock.bind(endpoint)
        return sock

    def _load_repository(self) -> None:
        opts = self.options
        wanted = set(opts.load_models)
        names = model_folder_names(opts.model_repository, opts.runtime_dir)
        self.registry.known.update(names)
        for entry in names:
            if opts.model_control_mode != "none" and not wanted & {"*", entry}:
                continue
            try:
                self.control.load(entry, time.monotonic())
            except ServerError:
                pass  # logged, and kept in the registry as the reason
        for name in sorted(wanted - {"*"} - {p.name for p in self.control.pending}):
            if name not in self.registry.load_errors:
                self.registry.fail(name, "no such model in the repository")
                log.error("event=model_load_failed model=%s error='no such model in the repository'", name)

    def start_instances(self, state: ModelState, devices: list[str]) -> None:
        endpoint = worker_endpoint(self.options.runtime_dir)
        for instance, device in enumerate(devices):
            cpus = cpus_for(self.options.cpu_affinity, state.name, instance)
            pinned = cpu_arg(cpus) if cpus else None
            spec = WorkerSpec(state.name, state.version, instance, device, state.version_dir.parent.parent,
                              endpoint, state.generation, pinned)  # fmt: skip (a load override's folder too)
            self._spec_state[spec] = state
            self.spawn(spec)

    def spawn(self, spec: WorkerSpec) -> None:
        state = self._spec_state[spec]
        if state.retired:
            return
        wp = self.supervisor.spawn(spec)
        self.pool.add(wp.identity, state, wp.started)

    def close(self) -> None:
        """Fail what is queued, stop the workers, close and remove the sockets."""
        if self.frontend is not None:
            stopping = Unavailable("the server is shutting down")
            self.admission.fail_queued(stopping)
            if self.on_demand is not None:
                self.on_demand.fail_all(stopping)
            self.completion.fail_running(stopping)
            self.ensembles.close()
            self.caching.readers.close()  # the broker maps no client region after this
        if self.backend is not None:
            for identity in self.pool.workers():
                self.outbox.send_worker(identity, Command.W_SHUTDOWN, empty_to_wire(Shutdown()))
        self.supervisor.stop_all(self.options.exit_timeout_s)
        for sock in (self.frontend, self.backend):
            if sock is not None:
                sock.close(linger=0)
        if self.tcp is not None:
            self.tcp.close()
        self._ctx.destroy(linger=0)
        self.regions.close()
        if self.intake is not None:
            self.intake.close()
        self.runtime.release()
        self.observer.close()
        log.info("event=stopped")

    # ------------------------------------------------------------------------------------ loop

    def run(self, stop_requests: Callable[[], int]) -> None:
        """Serve until asked to stop. The first request drains: new requests are refused with Unavailable,
        what is queued and running finishes (up to the drain timeout); a second request stops at once."""
        assert self.frontend is not None and self.backend is not None
        waiter = PreciseWait(recv_first=True)  # one persistent epoll of the sockets' fds, µs deadlines
        tcp = self.tcp.sock if self.tcp is not None else None
        waiter.register(*[s for s in (self.frontend, self.backend, tcp) if s is not None])
        intake = self.intake
        if intake is not None:
            intake.watch(lambda fd, on: waiter.register(fd) if on else waiter.unregister(fd))
        if not tighten_timer_slack():
            log.info("event=timer_slack_unchanged")
        # the handlers drain calls, as callables made once (a bound method made per pass is freed per pass)
        on_worker: Callable[[bytes, list[Frame]], None] = self.worker_inbox.on_message
        on_client: Callable[[bytes, list[Frame]], None] = self._on_client
        while not self._should_exit(stop_requests()):
            events = waiter.poll(self.dispatcher.poll_timeout_ms())
            self.outbox.hold()  # replies of this turn to one connection go in one message
            if self.backend in events and drain_workers(self.backend, on_worker, self.outbox):
                waiter.touch(self.backend)  # (the replies it completed have left: see drain_workers)
            if self.frontend in events and drain(self.frontend, on_client, IPC_TAG):
                waiter.touch(self.frontend)
            if tcp is not None and tcp in events and drain(tcp, on_client, TCP_TAG):
                waiter.touch(tcp)
            if intake is not None and len(events) > (self.backend in events) + (self.frontend in events):
                for fd in intake.fds() & events.keys():  # raw descriptors woke it: the hand-off's
                    intake.on_readable(fd)
            now = time.monotonic()
            if now >= self._next_reap:
                self._next_reap = now + REAP_INTERVAL_S
                self.watch.reap(now)
            if now >= self._next_region_reap:
                self._next_region_reap = now + REGION_REAP_INTERVAL_S
                self._reap_regions()
            self.admission.expire(now)
            self.worker_inbox.readiness.expire(now)
            self.dispatcher.dispatch(now)
            self.observer.maybe_publish(now)
            if self.control.pending or self.registry.retiring:
                self.control.poll(now)
            if self.on_demand is not None:
                self.on_demand.poll(now)
            self._log_ready_once()
            self.outbox.flush()
            waiter.touch_each(self.outbox.take_sent())  # a send may take a message's wake-up
        waiter.close()

    def _should_exit(self, requests: int) -> bool:
        if not requests:
            return False
        now = time.monotonic()
        if self.draining_since is None:
            self.draining_since = now
            queued, running = self.dispatcher.queued(), len(self.pool.running())
            log.info("event=draining queued=%d running=%d", queued, running)
        if requests > 1 or now - self.draining_since > self.options.drain_timeout_s:
            return True
        return not self.pool.running() and not self.dispatcher.queued()

    def _log_ready_once(self) -> None:
        if self._ready_logged:
            return
        if self.control.pending:
            pending = [s for p in self.control.pending for s in p.states]
            self.startup.progress(time.monotonic(), pending, len(self.registry.models))
            return
        states = list(self.registry.states())
        failed = [s.name for s in states if s.error] + list(self.registry.load_errors)
        self._ready_logged = self.startup.ready(time.monotonic(), [f"{s.name}:{s.version}" for s in states
                                                                   if s.ready], failed)  # fmt: skip

    @property
    def startup_done(self) -> bool:
        return self._ready_logged

    def serving_ready(self) -> bool:
        """Triton's server readiness: started, not draining, and every model that should serve is ready."""
        return self.startup_done and self.draining_since is None and self.registry.all_ready()

    # ------------------------------------------------------------------------------------ clients

    def _on_client(self, identity: bytes, frames: list[Frame]) -> None:
        """One message from a client, or a BUNDLE of several: each handled as if it had come alone."""
        infer = protocol.decode_infer(frames)
        if infer is not None:  # a lone INFER, read straight from its bytes
            return self._on_client_message(identity, infer)
        messages = protocol.decode_infer_bundle(frames)  # a BUNDLE of INFERs, each read from its bytes
        if messages is None:
            try:
                messages = protocol.decode_many(frames, protocol.CLIENT_COMMANDS)
            except ProtocolError as exc:
                log.warning("event=bad_client_message error=%r", str(exc))
                self.outbox.send_client(identity, Reply("", Status.INVALID_ARGUMENT, f"ProtocolError: {exc}"))
                return
        if len(messages) > 1 or protocol.is_bundle(frames):
            self.outbox.bundles_to(identity)  # it speaks bundles: its replies may come bundled too
        for msg in messages:
            self._on_client_message(identity, msg)

    def _on_client_message(self, identity: bytes, msg: protocol.Message) -> None:
        rid = protocol.request_id_of(msg.record_or_header)
        try:
            if msg.command == Command.INFER:
                self.outbox.check_reading(identity)  # a connection not reading its replies gets no more work
                if self.on_demand is not None and self.on_demand.park(identity, msg, time.monotonic()):
                    return  # it waits for its model's load
                self.admission.admit(identity, msg.record_or_header, msg.frames)
                return
            if msg.command in QUERIES:
                body = self.on_demand.model_info(msg.command, msg.header) if self.on_demand else None
                if body is None:  # (on-demand answers the metadata of models not loaded yet)
                    body = self.queries.answer(msg.command, msg.header, identity)
            else:
                body = self.controls.handle(identity, msg.command, msg.header)
            if body is LATER:
                return
        except ProtocolError as bad:  # (one name per handler: see scheduler.Batching.add)
            self.outbox.send_client(identity, Reply(rid, Status.INVALID_ARGUMENT, f"InvalidArgument: {bad}"))
            return
        except ServerError as error:
            self.outbox.send_client(identity, Reply(rid, error.status, error.wire_text()))
            return
        except Exception as bug:  # a handler bug must never take the broker down
            log.exception("event=handler_failed command=%s", msg.command.name)
            self.outbox.send_client(
                identity, Reply(rid, Status.INTERNAL, f"InternalError: {type(bug).__name__}")
            )
            return
        self.outbox.send_client(identity, Reply(rid, Status.OK, body=body))

    # ------------------------------------------------------------------------------------ workers

    def _reap_regions(self) -> None:
        """Regions of connections that are gone: unregister, unmap in the workers, close.

        A connection is judged by the connection itself, never by a pid (a client may live in another PID
        namespace): ``Outbox.client_connected`` probes each connection holding regions."""
        if self.intake is not None:
            self.intake.expire()
        self.outbox.backlog.prune()
        for client in self.regions.clients():
            if self.outbox.client_connected(client):
                continue
            regions = self.regions.drop_client(client)
            log.info("event=regions_reaped reason=connection_gone count=%d", len(regions))
            for region in regions:
                self.drop_region(region)

    def drop_region(self, region: Region) -> None:
        """A region is no longer registered: forget the cache's mapping, tell every worker to unmap it, and
        close the broker's descriptor (a worker that had not opened it yet fails that request cleanly)."""
        self.caching.readers.drop(region.name)
        for identity in self.pool.workers():
            self.outbox.send_worker(
                identity, Command.W_DROP_REGION, drop_region_to_wire(DropRegion(region.name))
            )
        self.regions.release(region)

