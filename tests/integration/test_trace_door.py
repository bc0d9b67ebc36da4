"""The front door's own timestamps in a trace (Triton's HTTP_RECV/SEND and GRPC_WAITREAD/SEND), with Triton's
own clients against a real ``zinfer serve --http --grpc``."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_grpc, wait_http
from tests.integration.test_tracing import ORDER, traces
from zinfer.client.protocol import TRACE_ID

pytestmark = pytest.mark.integration

HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]


@pytest.fixture
def traced_doors(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str, Path]]:
    repo = repository(tmp_path, ("add",))
    http_url, grpc_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    path = tmp_path / "trace.json"
    trace = ("--trace-config", f"triton,file={path}", "--trace-config", "level=TIMESTAMPS",
             "--trace-config", "rate=1")  # fmt: skip
    server = start_server(repo, "--http", http_url, "--grpc", grpc_url, *trace)
    try:
        wait_http(http_url)
        wait_grpc(grpc_url).close()
        yield server, http_url, grpc_url, path
    finally:
        stop_all([server])


def _inputs(mod: Any) -> list[Any]:
    out = []
    for name in ("INPUT_A", "INPUT_B"):
        i = mod.InferInput(name, [1, 1], "FP32")
        i.set_data_from_numpy(np.ones((1, 1), np.float32))
        out.append(i)
    return out


def test_door_timestamps_join_the_trace(traced_doors: tuple[ServerProcess, str, str, Path]) -> None:
    server, http_url, grpc_url, path = traced_doors
    h = httpclient.InferenceServerClient(http_url, network_timeout=30.0)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        for i in range(3):
            got = h.infer("add", _inputs(httpclient), request_id=f"http-{i}").get_response()
            assert TRACE_ID not in got.get("parameters", {})  # the broker's token stays inside zinfer
            reply = g.infer("add", _inputs(grpcclient), request_id=f"grpc-{i}").get_response()
            assert TRACE_ID not in reply.parameters
        # stamps leave in the background after each answer: a later call through each door gives the
        # ones checked below time to arrive before the server stops
        h.infer("add", _inputs(httpclient), request_id="http-last")
        g.infer("add", _inputs(grpcclient), request_id="grpc-last")
        h.update_trace_settings(settings={"trace_level": ["OFF"]})
        h.infer("add", _inputs(httpclient), request_id="untraced")
    finally:
        h.close()
        g.close()
    assert server.stop(signal.SIGTERM) == 0
    by_rid = {t["request_id"]: t for t in traces(json.loads(path.read_text())).values()}
    assert "untraced" not in by_rid
    for rid, names in [(f"http-{i}", HTTP) for i in range(3)] + [(f"grpc-{i}", GRPC) for i in range(3)]:
        t = by_rid[rid]
        assert [s["name"] for s in t["timestamps"]] == ORDER
        assert [s["name"] for s in t["door"]] == names, rid
        door = [s["ns"] for s in t["door"]]
        broker = {s["name"]: s["ns"] for s in t["timestamps"]}
        assert door == sorted(door)
        # one clock (CLOCK_MONOTONIC) in both processes: the door read the request before the broker had
        # it, and sent the answer after the broker's request began
        assert door[1] <= broker["REQUEST_START"] <= broker["COMPUTE_END"] <= door[2] <= door[3]
