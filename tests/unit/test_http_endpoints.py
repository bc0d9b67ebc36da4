"""HttpEndpoints over a real socket on 127.0.0.1: metrics and health answers follow the snapshot."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from zinfer.broker.http_endpoints import HealthSnapshot, HttpEndpoints
from zinfer.broker.metrics import CONTENT_TYPE, ServerMetrics


class Board:
    """Stands in for the broker: holds the snapshot it publishes."""

    def __init__(self) -> None:
        self.snapshot = HealthSnapshot()

    def __call__(self) -> HealthSnapshot:
        return self.snapshot


@pytest.fixture
def board() -> Board:
    return Board()


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics(gpu=False, process=False)


@pytest.fixture
def endpoints(board: Board, metrics: ServerMetrics) -> Iterator[HttpEndpoints]:
    ep = HttpEndpoints(metrics.render, board, host="127.0.0.1", port=0)
    ep.start()
    yield ep
    ep.stop()


def get(ep: HttpEndpoints, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{ep.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers["Content-Type"], err.read()


def test_metrics_endpoint_serves_the_exposition_text(
    endpoints: HttpEndpoints, metrics: ServerMetrics
) -> None:
    metrics.model("add", 1).success(10.0, 1.0, 1)
    status, ctype, body = get(endpoints, "/metrics")
    assert status == 200
    assert ctype == CONTENT_TYPE
    assert b'nv_inference_request_success{model="add",version="1"} 1.0' in body


def test_server_health_flips_with_the_snapshot(endpoints: HttpEndpoints, board: Board) -> None:
    assert get(endpoints, "/v2/health/live")[0] == 503
    assert get(endpoints, "/v2/health/ready")[0] == 503
    board.snapshot = HealthSnapshot(live=True, ready=False)
    assert get(endpoints, "/v2/health/live")[0] == 200
    assert get(endpoints, "/v2/health/ready")[0] == 503
    board.snapshot = HealthSnapshot(live=True, ready=True)
    assert get(endpoints, "/v2/health/ready")[0] == 200
    assert get(endpoints, "/v2/health/ready", method="HEAD")[0] == 200
    board.snapshot = HealthSnapshot(live=False, ready=True)  # shutting down: not ready either
    assert get(endpoints, "/v2/health/ready")[0] == 503


def test_model_readiness_200_503_404(endpoints: HttpEndpoints, board: Board) -> None:
    board.snapshot = HealthSnapshot.build(
        True, True, [("add", 1, False), ("add", 2, True), ("broken", None, False), ("a b", 1, True)]
    )
    assert get(endpoints, "/v2/models/add/ready")[0] == 200  # some version is ready
    assert get(endpoints, "/v2/models/add/versions/2/ready")[0] == 200
    assert get(endpoints, "/v2/models/add/versions/1/ready")[0] == 503
    assert get(endpoints, "/v2/models/broken/ready")[0] == 503  # failed to load: known, not ready
    assert get(endpoints, "/v2/models/a%20b/ready")[0] == 200
    status, ctype, body = get(endpoints, "/v2/models/nope/ready")
    assert (status, ctype) == (404, "application/json")
    assert b"Request for unknown model: 'nope' is not found" in body
    assert get(endpoints, "/v2/models/add/versions/3/ready")[0] == 404
    assert get(endpoints, "/v2/models/add/versions/x/ready")[0] == 404
    board.snapshot = HealthSnapshot.build(True, True, [("add", 1, False), ("add", 2, False)])
    assert get(endpoints, "/v2/models/add/ready")[0] == 503
    assert get(endpoints, "/v2/models/add/versions/2/ready")[0] == 503


def test_unknown_paths_and_query_strings(endpoints: HttpEndpoints, board: Board) -> None:
    board.snapshot = HealthSnapshot(live=True)
    assert get(endpoints, "/")[0] == 404
    assert get(endpoints, "/v2/models/add")[0] == 404
    assert get(endpoints, "/v2/health/live?verbose=1")[0] == 200
    assert get(endpoints, "/metrics", method="POST")[0] == 501


def test_a_failing_callback_answers_500_and_the_server_keeps_serving(board: Board) -> None:
    def broken() -> bytes:
        raise RuntimeError("boom")

    ep = HttpEndpoints(broken, board, host="127.0.0.1", port=0)
    ep.start()
    try:
        assert get(ep, "/metrics")[0] == 500
        board.snapshot = HealthSnapshot(live=True)
        assert get(ep, "/v2/health/live")[0] == 200
    finally:
        ep.stop()


def test_a_silent_connection_does_not_block_others(endpoints: HttpEndpoints, board: Board) -> None:
    board.snapshot = HealthSnapshot(live=True)
    with socket.create_connection(("127.0.0.1", endpoints.port), timeout=5):  # sends nothing
        assert get(endpoints, "/v2/health/live")[0] == 200


def test_connections_beyond_the_limit_are_dropped(board: Board) -> None:
    board.snapshot = HealthSnapshot(live=True)
    ep = HttpEndpoints(lambda: b"", board, host="127.0.0.1", port=0, max_connections=1)
    ep.start()
    try:
        with socket.create_connection(("127.0.0.1", ep.port), timeout=5) as hog:
            hog.sendall(b"GET ")  # holds the only slot
            with socket.create_connection(("127.0.0.1", ep.port), timeout=5) as second:
                second.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
                assert second.recv(100) == b""  # closed without an answer
        deadline = time.monotonic() + 5  # the hog's slot comes back once its handler sees EOF
        while True:
            try:
                assert get(ep, "/v2/health/live")[0] == 200
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.01)
    finally:
        ep.stop()


def test_stop_closes_the_socket_and_is_idempotent(board: Board) -> None:
    ep = HttpEndpoints(lambda: b"", board, host="127.0.0.1", port=0)
    ep.start()
    port = ep.port
    assert port != 0
    ep.stop()
    ep.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_taken_port_raises_on_start(endpoints: HttpEndpoints, board: Board) -> None:
    other = HttpEndpoints(lambda: b"", board, host="127.0.0.1", port=endpoints.port)
    with pytest.raises(OSError):
        other.start()
