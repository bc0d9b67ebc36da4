"""The worker process: one model instance behind a DEALER socket.

It loads its model, says READY, then runs each EXECUTE it receives and answers with a RESULT. It exits
on SHUTDOWN, on SIGTERM, or when the broker that started it is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from zinfer.broker.model_config import load_model_config
from zinfer.broker.signature import Signature
from zinfer.client import protocol
from zinfer.client.errors import ConfigError, ProtocolError
from zinfer.client.protocol import Command, Frame
from zinfer.client.transport import send_frames

from . import bls
from .batch import BatchRequest, run_batch
from .device import CPU, Device, open_device
from .heartbeat import Heartbeat
from .loader import load_model
from .model import AnyModel
from .regions import RegionCache
from .stream import run_stream

log = logging.getLogger(__name__)

POLL_MS = 500


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


class Worker:
    def __init__(self, args: WorkerArgs) -> None:
        self.args = args
        self.regions = RegionCache()
        self.device: Device = CPU
        self._stop = False
        self._ctx = zmq.Context()
        self.sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, args.identity)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(args.endpoint)
        self.heartbeat = Heartbeat(self._ctx, args.endpoint, args.identity, args.heartbeat_s, args.liveness)
        self.heartbeat.start()

    def request_stop(self, *_: object) -> None:
        self._stop = True

    def send(self, command: Command, header: dict[str, Any], frames: list[Frame] | None = None) -> None:
        send_frames(self.sock, protocol.encode(command, header, frames or ()))

    def load(self) -> tuple[Signature, AnyModel] | None:
        a = self.args
        try:
            config = load_model_config(a.repository / a.model / "config.pbtxt", a.model)
            bls.configure(a.server_url, a.model, sum(g.count for g in config.instance_group))
            self.device = open_device(a.device)
            self.regions.pinner = self.device
            model = load_model(config, a.repository / a.model / str(a.version), self.device, a.instance)
        except (Exception, SystemExit) as exc:
            # our own load errors already name the model or file; anything else gets its type
            error = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            log.error("event=load_failed model=%s version=%d error=%r", a.model, a.version, error)
            self.send(Command.W_LOAD_FAILED, {"error": error})
            return None
        return Signature.of(config), model

    def serve(self) -> int:
        loaded = self.load()
        if loaded is None:
            self.close()
            return 1
        sig, model = loaded
        a = self.args
        self.send(
            Command.W_READY,
            {
                "model": a.model,
                "version": a.version,
                "instance": a.instance,
                "device": a.device,
                "pid": os.getpid(),
            },
        )
        log.info(
            "event=worker_ready model=%s version=%d instance=%d pid=%d",
            a.model,
            a.version,
            a.instance,
            os.getpid(),
        )
        try:
            while not self._stop:
                if not self.sock.poll(POLL_MS, zmq.POLLIN):
                    if os.getppid() != a.parent:
                        log.warning("event=broker_gone model=%s", a.model)
                        break
                    continue
                frames = self.sock.recv_multipart(copy=False)
                try:
                    msg = protocol.decode([f.buffer for f in frames])
                except ProtocolError as exc:
                    log.error("event=bad_message error=%r", str(exc))
                    continue
                if msg.command == Command.W_SHUTDOWN:
                    break
                if msg.command == Command.W_EXECUTE:
                    self._execute(sig, model, msg.header, msg.frames)
                elif msg.command == Command.W_DROP_REGION:
                    self.regions.drop(str(msg.header.get("name", "")))
        finally:
            try:
                model.finalize()
            except Exception:
                log.exception("event=finalize_failed model=%s", a.model)
            self.close()
        return 0

    def _execute(self, sig: Signature, model: AnyModel, header: dict[str, Any], frames: list[Frame]) -> None:
        try:
            requests = [BatchRequest.from_broker(r) for r in header["requests"]]
        except (KeyError, TypeError, ValueError) as exc:
            log.error("event=bad_execute error=%r", str(exc))
            return
        if sig.decoupled:
            batch_id = header["batch"]

            def partial(result: dict[str, Any], out_frames: list[Frame]) -> None:
                self.send(
                    Command.W_RESULT, {"batch": batch_id, "results": [result], "partial": True}, out_frames
                )

            outcome = run_stream(model, sig, requests, frames, self.regions, partial)
        else:
            outcome = run_batch(model, sig, requests, frames, self.regions, self.device)
        self.send(
            Command.W_RESULT,
            {
                "batch": header["batch"],
                "results": outcome.results,
                "t": [outcome.input_ns, outcome.infer_ns, outcome.output_ns],
            },
            outcome.frames,
        )

    def close(self) -> None:
        bls.close()
        self.heartbeat.stop()
        self.regions.close()
        try:
            self.device.close()
        except Exception as exc:
            log.warning("event=device_close_failed error=%r", exc)
        self.sock.close()
        self._ctx.term()


def main_loop(args: WorkerArgs) -> int:
    worker = Worker(args)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the broker stops us
    signal.signal(signal.SIGTERM, worker.request_stop)
    started = time.monotonic()
    code = worker.serve()
    log.debug("event=worker_exit code=%d uptime_s=%.1f", code, time.monotonic() - started)
    return code
