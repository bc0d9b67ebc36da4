"""The front-door processes of ``zinfer serve --grpc/--http``: started, watched, restarted and stopped.

Each is ``python -m zinfer.frontdoor.process``, an ordinary client of the broker over its local socket, so
the broker stays one loop and knows nothing of gRPC or HTTP; all of them listen on the same ports
(SO_REUSEPORT) and the kernel spreads connections among them. One that dies is started again after a
growing backoff (given up after ``len(RESTART_BACKOFF_S)`` crashes within ``CRASH_WINDOW_S``, as for
workers). Their pids and request counts come from the status file each writes every second
(``<runtime dir>/frontdoor/<index>.json``); ``snapshot`` is what ``zinfer status`` and the metrics show.

The broker imports nothing of ``zinfer.frontdoor``: it starts a command line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zinfer.client.cpu_pinning import cpu_arg

from .supervisor import CRASH_WINDOW_S, RESTART_BACKOFF_S

log = logging.getLogger(__name__)

FOLDER_NAME = "frontdoor"


@dataclass(frozen=True)
class FrontDoorConfig:
    """What ``zinfer serve`` passes to every front-door process."""

    workers: int
    broker_url: str
    runtime_dir: Path
    grpc: str | None = None
    http: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    insecure_remote: bool = False
    max_tensor_bytes: int = 1 << 32
    log_level: str = "INFO"
    model_repository: Path | None = None  # the front door reads classification's label files there
    allow_unknown_shm_callers: bool = False
    http_header_timeout_s: float | None = None  # None: the front door's default
    http_peer_connections: int | None = None
    cpus: frozenset[int] | None = None  # every door process pinned to these CPUs (None: not pinned)

    @property
    def enabled(self) -> bool:
        return self.workers > 0 and (self.grpc is not None or self.http is not None)

    @property
    def folder(self) -> Path:
        return self.runtime_dir / FOLDER_NAME

    def command(self, index: int) -> list[str]:
        cmd = [
            sys.executable, "-m", "zinfer.frontdoor.process",
            "--broker-url", self.broker_url,
            "--shm-folder", str(self.folder / "shm"),
            "--status-file", str(self.folder / f"{index}.json"),
            "--index", str(index),
            "--parent", str(os.getpid()),
            "--max-tensor-bytes", str(self.max_tensor_bytes),
            "--log-level", self.log_level,
        ]  # fmt: skip
        optional = (("--grpc", self.grpc), ("--http", self.http), ("--tls-cert", self.tls_cert),
                    ("--tls-key", self.tls_key), ("--tls-client-ca", self.tls_client_ca),
                    ("--model-repository", self.model_repository))  # fmt: skip
        for flag, value in optional:
            if value is not None:
                cmd += [flag, str(value)]
        if self.insecure_remote:
            cmd.append("--insecure-remote")
        if self.allow_unknown_shm_callers:
            cmd.append("--allow-unknown-shm-callers")
        if self.http_header_timeout_s is not None:
            cmd += ["--http-header-timeout", repr(self.http_header_timeout_s)]
        if self.http_peer_connections is not None:
            cmd += ["--http-peer-connections", str(self.http_peer_connections)]
        if self.cpus:
            cmd += ["--cpus", cpu_arg(self.cpus)]
        return cmd


# what each door imports beyond zinfer's own dependencies: the ``frontdoor`` extra
_DOOR_MODULES = {
    "--grpc": ("grpc", "google.protobuf", "tritonclient.grpc.service_pb2_grpc"),
    "--http": ("httptools",),
}
EXTRA_HINT = "pip install 'zinfer[frontdoor]'"
PROBE_TIMEOUT_S = 60.0
LISTEN_CHECK_S = 0.02


def missing_extra(config: FrontDoorConfig) -> str | None:
    """Why the doors ``config`` asks for cannot start, or None: a module of the ``frontdoor`` extra that
    does not import. Checked in a child process with this interpreter (the broker itself imports none of
    them), before the server starts anything, so that ``zinfer serve --grpc`` without the extra fails at
    once (exit 2) instead of serving with a door that crashes."""
    wanted = {flag: mods for flag, mods in _DOOR_MODULES.items()
              if (config.grpc if flag == "--grpc" else config.http) is not None}  # fmt: skip
    probe = (
        "import importlib, sys\n"
        "for flag, name in (a.split('=', 1) for a in sys.argv[1:]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        print(flag, exc)\n"
        "        break\n"
    )
    args = [f"{flag}={name}" for flag, names in wanted.items() for name in names]
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("event=frontdoor_probe_failed error=%r", str(exc))
        return None  # the door's own start says what is wrong
    found = out.stdout.strip().splitlines()
    if not found:
        return None
    flag, _, error = found[0].partition(" ")
    return f"{flag} needs the front door's extra, which is not installed ({error}): {EXTRA_HINT}"


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)
    due: float | None = None  # when to start it again after a crash
    given_up: bool = False


class FrontDoorProcs:
    """``config.workers`` front-door processes. Call ``poll`` often (the server does, from its loop)."""

    def __init__(self, config: FrontDoorConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._slots = [_Slot(i) for i in range(config.workers)]
        self._stopping = False
        self._listening = False
        self._next_listen_check = 0.0

    def start(self) -> None:
        """Start every process. What a previous server left in the folder (shared memory registrations of
        its clients, status files) is removed first: as in Triton, registrations do not outlive a server."""
        shutil.rmtree(self.config.folder, ignore_errors=True)
        self.config.folder.mkdir(mode=0o700)
        for slot in self._slots:
            self._spawn(slot)

    def _spawn(self, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(
            self.config.command(slot.index), stdin=subprocess.DEVNULL, close_fds=True
        )
        slot.due = None
        log.info("event=frontdoor_spawned index=%d pid=%d", slot.index, slot.proc.pid)

    def poll(self) -> None:
        """Notice exits and start again the processes whose backoff has passed."""
        if self._stopping:
            return
        now = self.clock()
        for slot in self._slots:
            if slot.proc is not None and (code := slot.proc.poll()) is not None:
                log.warning("event=frontdoor_exited index=%d pid=%d code=%d", slot.index, slot.proc.pid, code)
                slot.proc = None
                slot.crashes = [t for t in slot.crashes if now - t < CRASH_WINDOW_S]
                if len(slot.crashes) >= len(RESTART_BACKOFF_S):
                    slot.given_up = True
                    log.error("event=frontdoor_given_up index=%d crashes=%d", slot.index, len(slot.crashes))
                    continue
                slot.due = now + RESTART_BACKOFF_S[len(slot.crashes)]
                slot.crashes.append(now)
            if slot.proc is None and slot.due is not None and now >= slot.due:
                slot.restarts += 1
                self._spawn(slot)

    def listening(self) -> bool:
        """Whether every process has written its status file (it does once its ports are bound); checked
        at most every ``LISTEN_CHECK_S``, and true for good once seen."""
        if self._listening or self._stopping:
            return True
        now = self.clock()
        if now < self._next_listen_check:
            return False
        self._next_listen_check = now + LISTEN_CHECK_S
        self._listening = all(self._figures(s) for s in self._slots) or all(s.given_up for s in self._slots)
        return self._listening

    def _figures(self, slot: _Slot) -> dict[str, Any]:
        """What ``slot``'s running process last wrote to its status file ({} when none or not yet)."""
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return {}
        try:
            figures = json.loads((self.config.folder / f"{slot.index}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return figures if isinstance(figures, dict) and figures.get("pid") == proc.pid else {}

    def snapshot(self) -> list[dict[str, Any]]:
        """Each process: index, pid, up, restarts and its request counts (from its status file)."""
        rows = []
        for slot in self._slots:
            proc = slot.proc
            up = proc is not None and proc.poll() is None
            figures = self._figures(slot)  # {} when not written by this incarnation yet
            rows.append({
                "index": slot.index, "pid": proc.pid if proc is not None else None, "up": up,
                "restarts": slot.restarts, "given_up": slot.given_up,
                "grpc": self.config.grpc, "http": self.config.http,
                "requests": figures.get("requests", {}),
            })  # fmt: skip
        return rows

    def terminate(self) -> None:
        """SIGTERM every process, without waiting: they take no new requests and finish what they hold
        (for up to 2 s) while the broker, still looping, answers them. Nothing is restarted after this."""
        if self._stopping:
            return
        self._stopping = True
        for slot in self._slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every process (they finish what they hold for up to 2 s), SIGKILL those still there."""
        self.terminate()
        procs = [s.proc for s in self._slots if s.proc is not None]
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for slot in self._slots:
            slot.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.config.folder, ignore_errors=True)
