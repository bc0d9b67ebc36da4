"""The front door runs on uvloop where it is installed (the ``frontdoor`` extra brings it) and on asyncio's
loop with ``ZINFER_FRONTDOOR_LOOP=asyncio``; both serve HTTP and gRPC, and the log says which."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_grpc, wait_http

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def _add_inputs(module: Any, value: float) -> list[Any]:
    a = np.full((1, 1), value, dtype=np.float32)
    inputs = [module.InferInput(name, [1, 1], "FP32") for name in ("INPUT_A", "INPUT_B")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


@pytest.mark.parametrize("loop", ["default", "asyncio"])
def test_both_loops_serve_http_and_grpc(loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if loop == "asyncio":
        monkeypatch.setenv("ZINFER_FRONTDOOR_LOOP", "asyncio")
    else:
        monkeypatch.delenv("ZINFER_FRONTDOOR_LOOP", raising=False)
    repo = repository(tmp_path, ("add",))
    grpc_url, http_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = start_server(repo, "--grpc", grpc_url, "--http", http_url, runtime_dir=tmp_path / "run")
    try:
        wait_http(http_url)
        with httpclient.InferenceServerClient(http_url) as h:
            out = h.infer("add", _add_inputs(httpclient, 1.5)).as_numpy("OUTPUT_SUM")
        assert out is not None and out.tolist() == [[3.0]]
        g = wait_grpc(grpc_url)
        try:
            out = g.infer("add", _add_inputs(grpcclient, 2.0)).as_numpy("OUTPUT_SUM")
        finally:
            g.close()
        assert out is not None and out.tolist() == [[4.0]]
        expected = "uvloop" if loop == "default" and HAVE_UVLOOP else "asyncio"
        assert f"event=frontdoor_event_loop loop={expected}" in server.log(), server.log()
    finally:
        stop_all([server])
