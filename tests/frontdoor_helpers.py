"""Shared by the front-door integration tests: a model repository with the bundled models plus ``echo``
(INT8, BF16 and BYTES through the identity kernel), free ports, waiting for the gRPC and HTTP ports, and a
server with both front doors for a test module's repository."""

from __future__ import annotations

import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tritonclient.grpc as grpcclient

from tests.conftest import MODELS, ServerProcess, start_server, stop_all

ECHO_CONFIG = """
name: "echo"
backend: "zinfer"
max_batch_size: 8
input [
  { name: "I8" data_type: TYPE_INT8 dims: [ -1 ] },
  { name: "BF" data_type: TYPE_BF16 dims: [ -1 ] }
]
output [
  { name: "I8_OUT" data_type: TYPE_INT8 dims: [ -1 ] },
  { name: "BF_OUT" data_type: TYPE_BF16 dims: [ -1 ] }
]
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "kernel" value: { string_value: "identity" } }
"""


def repository(root: Path, names: tuple[str, ...]) -> Path:
    repo = root / "models"
    repo.mkdir()
    for name in names:
        shutil.copytree(MODELS / name, repo / name)
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    return repo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_grpc(url: str, timeout: float = 60.0) -> grpcclient.InferenceServerClient:
    """A client once the front door at ``url`` answers ServerReady with true."""
    client = grpcclient.InferenceServerClient(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.is_server_ready(client_timeout=2.0):
                return client
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the front door at {url} did not become ready within {timeout} s")
        time.sleep(0.1)


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Until ``GET /v2/health/ready`` at ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the HTTP front door at {url} did not become ready within {timeout} s")
        time.sleep(0.1)


@contextmanager
def serve_front_doors(repo: Path) -> Iterator[tuple[str, str]]:
    """A server on ``repo`` with its HTTP and gRPC front doors on free loopback ports, both ready:
    ``(http_url, grpc_url)``; a front door that never gets ready fails with the server's log attached."""
    http_url, grpc_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server: ServerProcess = start_server(repo, "--http", http_url, "--grpc", grpc_url)
    try:
        try:
            wait_http(http_url)
            wait_grpc(grpc_url).close()
        except AssertionError as exc:  # a model that failed to load says why in the server's log
            exc.add_note(server.log()[-4000:])
            raise
        yield http_url, grpc_url
    finally:
        stop_all([server])
