"""The front door as processes of ``zinfer serve``: several on one port, restarted after a crash, seen in
``zinfer status`` and the metrics, refused on a non-loopback address without TLS, and unhurt by malformed
protobuf (fuzzed)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.conftest import MODELS, ServerProcess, start_server, stop_all, wait_for
from tests.frontdoor_helpers import free_port, wait_grpc
from zinfer.client import Client

pytestmark = pytest.mark.integration

PINNED = max(os.sched_getaffinity(0))  # --frontdoor-cpus of the module's server: a CPU this test may use

METHODS = (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelConfig",
    "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "TraceSetting", "LogSettings",
)  # fmt: skip


@pytest.fixture(scope="module")
def doors() -> Iterator[tuple[ServerProcess, str]]:
    url = f"127.0.0.1:{free_port()}"
    server = start_server(MODELS, "--grpc", url, "--frontdoor-workers", "2", "--frontdoor-cpus", str(PINNED))
    try:
        wait_grpc(url).close()
        yield server, url
    finally:
        stop_all([server])


def _frontdoors(server: ServerProcess) -> list[dict[str, Any]]:
    with Client(server.url, timeout=10) as c:
        rows: list[dict[str, Any]] = c.server_status()["frontdoors"]
        return rows


def _add(client: grpcclient.InferenceServerClient, value: float) -> float:
    a = np.full((1, 1), value, np.float32)
    inputs = [
        grpcclient.InferInput("INPUT_A", [1, 1], "FP32"),
        grpcclient.InferInput("INPUT_B", [1, 1], "FP32"),
    ]
    for i in inputs:
        i.set_data_from_numpy(a)
    result: float = client.infer("add", inputs, client_timeout=30).as_numpy("OUTPUT_SUM").item()
    return result


def test_two_processes_share_the_port_and_report(doors: tuple[ServerProcess, str]) -> None:
    server, url = doors
    wait_for(lambda: all(d["up"] and d["requests"] for d in _frontdoors(server)) or _touch(url), 30,
             "both front-door processes to report")  # fmt: skip
    rows = _frontdoors(server)
    assert [d["index"] for d in rows] == [0, 1]
    pids = {d["pid"] for d in rows}
    assert len(pids) == 2 and all(p in {c.pid for c in server.workers()} for p in pids)
    status = subprocess.run([sys.executable, "-m", "zinfer.broker", "status", "--url", server.url],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert "FRONT DOOR" in status.stdout and str(rows[0]["pid"]) in status.stdout
    metrics = urllib.request.urlopen(server.http_url + "/metrics", timeout=10).read().decode()
    assert 'zinfer_frontdoor_up{index="0"} 1.0' in metrics
    assert 'zinfer_frontdoor_requests_total{index="0",protocol="grpc",result="ok"}' in metrics


def _touch(url: str) -> bool:
    """New connections until both processes have answered one (the kernel spreads them)."""
    with grpcclient.InferenceServerClient(url) as c:
        c.is_server_live()
    return False


def _masks(pid: int) -> set[frozenset[int]]:
    """The CPU masks of process ``pid``'s threads (the loop's, libzmq's, gRPC's)."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


def test_front_door_cpus_pin_every_door_process(doors: tuple[ServerProcess, str]) -> None:
    server, url = doors
    wait_for(lambda: all(d["up"] for d in _frontdoors(server)), 30, "both front-door processes to be up")
    client = wait_grpc(url)
    try:
        assert _add(client, 1.5) == 3.0
    finally:
        client.close()
    for row in _frontdoors(server):  # each pins itself once it has read its flags, before it listens
        wait_for(lambda pid=row["pid"]: _masks(pid) == {frozenset({PINNED})}, 30, "the doors to be pinned")
    assert os.sched_getaffinity(server.proc.pid) == os.sched_getaffinity(0)  # the broker is not pinned


def test_front_door_cpus_outside_the_servers_own_are_refused(tmp_path: Any) -> None:
    for value, message in (("4095", "CPU 4095 is not one this server may run on"),
                           ("1-x", "is not a CPU list")):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "zinfer.broker", "serve", "--runtime-dir", str(tmp_path / "rt"),
             "--no-metrics", "--grpc", f"127.0.0.1:{free_port()}", "--frontdoor-cpus", value],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr
        assert not (tmp_path / "rt" / "frontdoor").exists()  # nothing started


def test_a_killed_front_door_is_restarted(doors: tuple[ServerProcess, str]) -> None:
    server, url = doors
    old = _frontdoors(server)[0]
    os.kill(old["pid"], signal.SIGKILL)
    wait_for(lambda: (d := _frontdoors(server)[0])["up"] and d["pid"] != old["pid"], 30,
             "the supervisor to restart the front door")  # fmt: skip
    new = _frontdoors(server)[0]
    assert new["restarts"] == old["restarts"] + 1
    client = wait_grpc(url)
    try:
        assert [_add(client, float(i)) for i in range(4)] == [0.0, 2.0, 4.0, 6.0]
    finally:
        client.close()
    # a restarted door keeps --frontdoor-cpus (it pins itself once it has read its flags)
    wait_for(lambda: _masks(new["pid"]) == {frozenset({PINNED})}, 30, "the restarted door to be pinned")


def test_a_non_loopback_address_without_tls_does_not_start(tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--runtime-dir", str(tmp_path / "rt"),
         "--no-metrics", "--grpc", f"0.0.0.0:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "not a loopback address" in proc.stderr and "--insecure-remote" in proc.stderr


def _hostile_requests() -> list[service_pb2.ModelInferRequest]:
    found = []

    def request(**fields: Any) -> service_pb2.ModelInferRequest:
        r = service_pb2.ModelInferRequest(model_name="add")
        r.inputs.add(**fields)
        found.append(r)
        return r

    request(name="INPUT_A", datatype="FP32", shape=[-1, 1])
    request(name="INPUT_A", datatype="FP32", shape=[1 << 62, 1 << 62]).raw_input_contents.append(b"")
    request(name="INPUT_A", datatype="NOPE", shape=[1])
    request(name="INPUT_A", datatype="FP32", shape=[1] * 64)
    request(name="INPUT_A", datatype="BYTES", shape=[3]).raw_input_contents.append(b"\xff\xff\xff\xff")
    request(name="INPUT_A", datatype="FP32", shape=[1]).raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    r = request(name="INPUT_A", datatype="FP32", shape=[1])
    r.inputs[0].parameters["shared_memory_region"].string_param = "nope"
    r = request(name="INPUT_A", datatype="FP32", shape=[1])
    r.parameters["sequence_id"].double_param = 1.5
    r = request(name="INPUT_A", datatype="FP16", shape=[1])
    r.inputs[0].contents.fp32_contents.append(1.0)
    return found


def test_malformed_protobuf_never_hurts_a_front_door(doors: tuple[ServerProcess, str]) -> None:
    server, url = doors
    before = {d["pid"] for d in _frontdoors(server)}
    rng = random.Random(17)
    with grpc.insecure_channel(url) as channel:
        for i in range(400):
            method = METHODS[i % len(METHODS)]
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            payload = rng.randbytes(rng.choice((1, 7, 64, 1024)))
            try:
                call(payload, timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED, method  # answered, never hung
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = list(stream(iter([rng.randbytes(64) for _ in range(20)]), timeout=30))
        assert all(isinstance(a, bytes) for a in answers)
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        for request in _hostile_requests():
            with pytest.raises(grpc.RpcError) as err:
                infer(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, err.value.details())
    assert {d["pid"] for d in _frontdoors(server)} == before
    client = wait_grpc(url)
    try:
        assert _add(client, 1.0) == 2.0
    finally:
        client.close()
