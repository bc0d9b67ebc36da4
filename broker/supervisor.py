"""Starts one worker process per model instance, watches them, and stops them."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .devices import worker_environment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to start."""

    model: str
    version: int
    instance: int
    device: str  # "cpu" or "gpu:<id>"
    repository: Path
    endpoint: str
    generation: int = 0  # each load of a model is a new generation; a reload runs beside the old one
    cpus: str | None = None  # CPU affinity of the worker, e.g. "0,1,2,3" (None: not pinned)

    def identity(self, incarnation: int) -> bytes:
        return f"{self.model}/{self.version}/{self.instance}/{self.generation}.{incarnation}".encode()


@dataclass
class WorkerProc:
    spec: WorkerSpec
    identity: bytes
    proc: subprocess.Popen[bytes]
    started: float
    incarnation: int = 1


RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
CRASH_WINDOW_S = 60.0


class RestartPolicy:
    """When to restart an instance that died: with growing backoff, and not at all after
    ``len(backoff)`` crashes within ``window`` seconds. Pure: the clock is passed in."""

    def __init__(
        self, backoff: tuple[float, ...] = RESTART_BACKOFF_S, window: float = CRASH_WINDOW_S
    ) -> None:
        self.backoff = backoff
        self.window = window
        self._crashes: dict[WorkerSpec, list[float]] = {}
        self._due: list[tuple[float, WorkerSpec]] = []

    def crashed(self, spec: WorkerSpec, now: float) -> int | None:
        """Record a crash; returns how many there were in the window if that is too many (give up)."""
        recent = [t for t in self._crashes.get(spec, []) if now - t < self.window]
        if len(recent) >= len(self.backoff):
            return len(recent)
        self._crashes[spec] = [*recent, now]
        self._due.append((now + self.backoff[len(recent)], spec))
        return None

    def due(self, now: float) -> list[WorkerSpec]:
        """Specs whose restart time has come."""
        ready = [s for t, s in self._due if t <= now]
        self._due = [(t, s) for t, s in self._due if t > now]
        return ready


class Supervisor:
    def __init__(
        self,
        log_level: str = "INFO",
        heartbeat_s: float = 1.0,
        liveness: int = 5,
        server_url: str | None = None,
        max_frame_bytes: int = -1,
    ) -> None:
        self.server_url = server_url
        self.max_frame_bytes = max_frame_bytes  # the workers' MAXMSGSIZE (-1: none)
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self._procs: dict[bytes, WorkerProc] = {}
        self._incarnations: dict[tuple[str, int, int, int], int] = {}
        self._log_level = log_level

    def spawn(self, spec: WorkerSpec) -> WorkerProc:
        key = (spec.model, spec.version, spec.instance, spec.generation)
        incarnation = self._incarnations.get(key, 0) + 1
        self._incarnations[key] = incarnation
        identity = spec.identity(incarnation)
        cmd = [
            sys.executable,
            "-m",
            "zinfer.workers",
            "--endpoint",
            spec.endpoint,
            "--repository",
            str(spec.repository),
            "--model",
            spec.model,
            "--version",
            str(spec.version),
            "--instance",
            str(spec.instance),
            "--device",
            spec.device,
            "--identity",
            identity.decode(),
            "--parent",
            str(os.getpid()),
            "--log-level",
            self._log_level,
            "--heartbeat-interval",
            str(self.heartbeat_s),
            "--heartbeat-liveness",
            str(self.liveness),
        ]
        if spec.cpus:
            cmd += ["--cpus", spec.cpus]
        if self.server_url:
            cmd += ["--server-url", self.server_url]
        if self.max_frame_bytes >= 0:
            cmd += ["--max-frame-bytes", str(self.max_frame_bytes)]
        env = worker_environment(spec.device, os.environ)  # a GPU worker sees its own GPU only
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, close_fds=True, env=env)
        wp = WorkerProc(spec, identity, proc, time.monotonic(), incarnation)
        self._procs[identity] = wp
        log.info("event=worker_spawned model=%s version=%d instance=%d generation=%d pid=%d", *key, proc.pid)
        return wp

    def get(self, identity: bytes) -> WorkerProc | None:
        return self._procs.get(identity)

    def reap(self) -> list[tuple[WorkerProc, int]]:
        """Workers that have exited since the last call, with their exit codes."""
        dead = []
        for identity, wp in list(self._procs.items()):
            code = wp.proc.poll()
            if code is not None:
                del self._procs[identity]
                dead.append((wp, code))
        return dead

    def kill(self, identity: bytes) -> None:
        wp = self._procs.get(identity)
        if wp is not None and wp.proc.poll() is None:
            wp.proc.kill()

    def procs(self) -> list[WorkerProc]:
        return list(self._procs.values())

    def pids(self) -> list[int]:
        return [wp.proc.pid for wp in self._procs.values()]

    def stop_all(self, timeout: float = 5.0) -> None:
        """Wait for workers told to shut down; SIGTERM, then SIGKILL, the ones that do not exit in time."""
        deadline = time.monotonic() + timeout
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            for wp in self._procs.values():
                if sig is not None and wp.proc.poll() is None:
                    wp.proc.send_signal(sig)
            for wp in self._procs.values():
                try:
                    wp.proc.wait(max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(wp.proc.poll() is not None for wp in self._procs.values()):
                break
            deadline = time.monotonic() + 2.0
        self._procs.clear()
