"""Triton's trace extension and W3C trace context through the front doors, with Triton's own clients."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import free_port, repository, wait_grpc, wait_http
from tests.integration.test_tracing import traces

pytestmark = pytest.mark.integration

TRACE_ID, SPAN_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACE_ID2, SPAN_ID2 = "11112222333344445555666677778888", "aaaabbbbccccdddd"


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str, Path]]:
    repo = repository(tmp_path, ("add", "double"))
    http_url, grpc_url = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    path = tmp_path / "trace.json"
    trace = ("--trace-config", f"triton,file={path}")
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


def _grpc_settings(response: Any) -> dict[str, list[str]]:
    return {k: list(v.value) for k, v in response.settings.items()}


def test_trace_settings_live_and_traceparent(doors: tuple[ServerProcess, str, str, Path]) -> None:
    server, http_url, grpc_url, path = doors
    h = httpclient.InferenceServerClient(http_url, network_timeout=30.0)
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        assert "trace" in h.get_server_metadata()["extensions"]
        assert "trace" in g.get_server_metadata(as_json=True)["extensions"]
        assert h.get_trace_settings()["trace_level"] == ["OFF"]
        # HTTP: turn tracing on for every request, globally
        got = h.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert got["trace_level"] == ["TIMESTAMPS"] and got["trace_rate"] == "1"
        # gRPC sees the change, and makes its own: a model's count
        assert _grpc_settings(g.get_trace_settings())["trace_rate"] == ["1"]
        got_g = _grpc_settings(g.update_trace_settings("double", {"trace_count": "0"}))
        assert got_g["trace_count"] == ["0"] and got_g["trace_level"] == ["TIMESTAMPS"]
        assert h.get_trace_settings("double")["trace_count"] == "0"
        # a bad change is refused by both, and changes nothing
        with pytest.raises(InferenceServerException, match="trace_rate"):
            h.update_trace_settings(settings={"trace_rate": "0"})
        with pytest.raises(InferenceServerException, match="trace_rate"):
            g.update_trace_settings(settings={"trace_rate": "-3"})
        with pytest.raises(InferenceServerException, match="trace_file"):
            h.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
        assert h.get_trace_settings()["trace_rate"] == "1"
        # W3C trace context from Triton's clients: an HTTP header and gRPC metadata
        h.infer("add", _inputs(httpclient), request_id="via-http",
                headers={"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-01"})  # fmt: skip
        g.infer("add", _inputs(grpcclient), request_id="via-grpc",
                headers={"traceparent": f"00-{TRACE_ID2}-{SPAN_ID2}-01"})  # fmt: skip
        h.infer("double", [_named(httpclient, "A"), _named(httpclient, "B")], request_id="not-traced")
        # a model's own settings dropped (HTTP POST with no settings): it follows the global ones again
        assert h.update_trace_settings("double", {})["trace_count"] == "-1"
        h.update_trace_settings(settings={"trace_level": ["OFF"]})
        h.infer("add", _inputs(httpclient), request_id="after-off")
    finally:
        h.close()
        g.close()
    assert server.stop(signal.SIGTERM) == 0
    got_traces = {t["request_id"]: t for t in traces(json.loads(path.read_text())).values()}
    assert sorted(got_traces) == ["via-grpc", "via-http"]
    assert got_traces["via-http"]["zinfer"]["trace_id"] == TRACE_ID
    assert got_traces["via-http"]["zinfer"]["parent_span_id"] == SPAN_ID
    assert got_traces["via-grpc"]["zinfer"]["trace_id"] == TRACE_ID2
    assert got_traces["via-grpc"]["zinfer"]["parent_span_id"] == SPAN_ID2


def _named(mod: Any, name: str) -> Any:
    i = mod.InferInput(name, [1, 1], "FP32")
    i.set_data_from_numpy(np.ones((1, 1), np.float32))
    return i


def test_plain_http_trace_endpoints(doors: tuple[ServerProcess, str, str, Path]) -> None:
    _, http_url, _, _ = doors

    def call(method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://{http_url}{path}", data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status), json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read())

    status, body = call("GET", "/v2/trace/setting")
    assert status == 200 and body["trace_mode"] == "triton"
    status, body = call("POST", "/v2/models/add/trace/setting", b'{"trace_rate": "7"}')
    assert status == 200 and body["trace_rate"] == "7"
    status, body = call("POST", "/v2/models/add/trace/setting", b'{"trace_rate": null}')
    assert status == 200 and body["trace_rate"] == "1000"  # cleared: the global value
    for bad in (b"[1]", b"{", b'{"trace_rate": 5}', b'{"trace_level": ["LOUD"]}'):
        status, body = call("POST", "/v2/trace/setting", bad)
        assert status == 400 and body["error"], bad
    status, _ = call("DELETE", "/v2/trace/setting")
    assert status == 405
    assert call("GET", "/v2/trace/setting")[1]["trace_rate"] == "1000"
