"""Shared by the front-door integration tests: a model repository with the bundled models plus ``echo``
(INT8, BF16 and BYTES through the identity kernel), free ports, and waiting for the gRPC port."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import tritonclient.grpc as grpcclient

from tests.conftest import MODELS

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
