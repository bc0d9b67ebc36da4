"""One front-door process's parts: its options, its bridge to the broker, the shared-memory registry and
its request counters. The gRPC and HTTP servers of the process share one ``FrontDoor``."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .bridge import Bridge
from .classification import LabelFiles
from .peer_uid import peer_uid
from .sysshm import SystemShm

__all__ = [
    "HEADER_TIMEOUT_S",
    "PEER_CONNECTIONS",
    "Counters",
    "FrontDoor",
    "FrontDoorOptions",
    "grpc_peer_uid",
]

HEADER_TIMEOUT_S = 10.0  # an HTTP request's line and headers must arrive within this of its first byte
PEER_CONNECTIONS = 256  # open HTTP connections per peer (per uid on this host, per address otherwise)


@dataclass(frozen=True)
class FrontDoorOptions:
    broker_url: str
    shm_folder: Path  # the system shared memory registry, shared by the front-door processes
    grpc: str | None = None  # HOST:PORT
    http: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # mutual TLS: clients must present a certificate signed by it
    insecure_remote: bool = False
    max_tensor_bytes: int = 1 << 30
    status_file: Path | None = None  # where the process writes its pid and request counts
    index: int = 0
    model_repository: Path | None = None  # where classification's label files are read (None: no labels)
    allow_unknown_shm_callers: bool = False  # system shm for callers whose uid cannot be established
    http_header_timeout_s: float = HEADER_TIMEOUT_S
    http_peer_connections: int = PEER_CONNECTIONS

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def message_limit(self) -> int:
        """The largest request or response message: one tensor's limit plus room for the rest."""
        return min(self.max_tensor_bytes + (1 << 20), (1 << 31) - 1)


def grpc_peer_uid(peer: str, listening: str | None) -> int | None:
    """The uid of a gRPC peer (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``) on this host's loopback, from
    the kernel (``peer_uid``); ``listening`` is the door's own HOST:PORT. None when unknown: a remote peer,
    a Unix-socket peer (grpc.aio does not give its descriptor), or no live socket matches."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6") or not listening:
        return None
    host, _, port = rest.rpartition(":")
    our_host, _, our_port = listening.rpartition(":")
    if not (port.isdigit() and our_port.isdigit()):
        return None
    host, our_host = host.strip("[]"), our_host.strip("[]")
    try:
        wildcard = ipaddress.ip_address(our_host).is_unspecified
    except ValueError:
        wildcard = True  # a name ("localhost"): any loopback address it may resolve to
    candidates = [host, "127.0.0.1", "::1"] if wildcard else [our_host]
    return peer_uid((host, int(port)), [(c, int(our_port)) for c in dict.fromkeys(candidates)])


@dataclass
class Counters:
    """Requests answered per protocol, ok and failed; written to the status file the server reads.

    Only the door's event loop touches them (``record`` per request, ``snapshot`` once per status
    interval), so no lock: ``write``, which may run in a thread, takes a snapshot made on the loop."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def record(self, protocol: str, ok: bool) -> None:
        self.entry(protocol)["ok" if ok else "failed"] += 1

    def entry(self, protocol: str) -> dict[str, int]:
        """``protocol``'s counts (made now when it has none), which a caller may keep and count in itself."""
        entry = self.counts.get(protocol)
        if entry is None:
            entry = self.counts[protocol] = {"ok": 0, "failed": 0}
        return entry

    def snapshot(self) -> dict[str, Any]:
        """The counts as they are now (a copy: ``record`` may go on while it is written)."""
        return {
            "pid": os.getpid(),
            "started": self.started,
            "requests": {name: dict(entry) for name, entry in self.counts.items()},
        }

    @staticmethod
    def write(path: Path, snapshot: dict[str, Any]) -> None:
        """``snapshot`` to ``path``, replaced at once (a reader never sees half a file)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot), encoding="utf-8")
        os.replace(tmp, path)


@dataclass
class FrontDoor:
    options: FrontDoorOptions
    bridge: Bridge
    shm: SystemShm
    counters: Counters = field(default_factory=Counters)
    labels: LabelFiles = field(default_factory=LabelFiles)  # classification's label files
