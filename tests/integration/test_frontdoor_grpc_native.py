"""The gRPC door on pygrpc-native (the ``frontdoor-native`` extra) when it is installed, on grpcio when
``ZINFER_GRPC_SERVER=grpcio`` says so; and what docs/frontdoor.md says of streams on it: a stream's caller
is not known by its uid (its calls come through grpcio behind a Unix socket), so it cannot name system
shared memory, while a unary call of the same client can."""

from __future__ import annotations

import importlib.util
import queue
import uuid
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.conftest import start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_grpc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("pygrpc_native") is None, reason="no pygrpc-native"),
]


def _inputs(nbytes: int) -> list[Any]:
    inputs = [grpcclient.InferInput("A", [2, 4], "FP32"), grpcclient.InferInput("B", [2, 4], "FP32")]
    inputs[0].set_shared_memory("nat_in", nbytes)
    inputs[1].set_shared_memory("nat_in", nbytes, offset=nbytes)
    return inputs


def test_native_unary_and_stream_with_shared_memory(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZINFER_GRPC_SERVER", raising=False)
    url = f"127.0.0.1:{free_port()}"
    server = start_server(repository(tmp_path, ("double",)), "--grpc", url)
    key = f"/fdnat_{uuid.uuid4().hex[:12]}"
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    handle = shm.create_shared_memory_region("nat_in", key, 2 * a.nbytes)
    try:
        client = wait_grpc(url)
        assert "server=pygrpc-native" in server.log()
        shm.set_shared_memory_region(handle, [a, a * 2])
        client.register_system_shared_memory("nat_in", key, 2 * a.nbytes)
        result = client.infer("double", _inputs(a.nbytes))  # unary: the caller's uid is known
        np.testing.assert_array_equal(result.as_numpy("SUM"), a * 3)
        results: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put(result if error is None else error))
        try:
            client.async_stream_infer("double", _inputs(a.nbytes))
            answer = results.get(timeout=30)
        finally:
            client.stop_stream()
        assert "Unable to find system shared memory region: 'nat_in'" in str(answer)
        client.unregister_system_shared_memory()
        client.close()
    finally:
        shm.destroy_shared_memory_region(handle)
        stop_all([server])


def test_grpcio_when_asked(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZINFER_GRPC_SERVER", "grpcio")
    url = f"127.0.0.1:{free_port()}"
    server = start_server(repository(tmp_path, ("double",)), "--grpc", url)
    try:
        wait_grpc(url).close()
        assert "server=grpcio" in server.log()
    finally:
        stop_all([server])
