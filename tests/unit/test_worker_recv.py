"""A worker's idle loop blocks in recv (RCVTIMEO), not in poll: a message wakes it at once, and with nothing
coming it still looks at its parent every POLL_MS (a broker that is gone stops it)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.conftest import MODELS
from zinfer.client import protocol
from zinfer.client.protocol import Command
from zinfer.workers.worker import POLL_MS, Worker, WorkerArgs


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], str]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'w.sock'}"
    sock.bind(endpoint)
    try:
        yield sock, endpoint
    finally:
        sock.close(linger=0)
        ctx.term()


def _start(endpoint: str, parent: int) -> tuple[threading.Thread, list[int]]:
    args = WorkerArgs(endpoint, MODELS, "add", 1, 0, "cpu", b"w-recv", parent, heartbeat_s=0.2)
    worker = Worker(args)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.serve()), daemon=True)
    thread.start()
    return thread, codes


def _wait_ready(sock: zmq.Socket[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sock.poll(100):
            who, *frames = sock.recv_multipart()
            if who == b"w-recv" and protocol.decode(frames).command == Command.W_READY:
                return
    raise AssertionError("the worker never said READY")


def test_a_shutdown_wakes_the_idle_worker_at_once(router: tuple[zmq.Socket[bytes], str]) -> None:
    sock, endpoint = router
    thread, codes = _start(endpoint, os.getppid())
    _wait_ready(sock)
    time.sleep(POLL_MS / 1000 / 2)  # in the middle of a receive
    t0 = time.monotonic()
    sock.send_multipart([b"w-recv", *protocol.encode(Command.W_SHUTDOWN, {})])
    thread.join(30)
    assert not thread.is_alive() and codes == [0]
    assert time.monotonic() - t0 < 5  # not a fixed wait: on a quiet machine it is well under POLL_MS


def test_a_worker_whose_broker_is_gone_stops_after_a_receive_times_out(
    router: tuple[zmq.Socket[bytes], str],
) -> None:
    sock, endpoint = router
    not_our_parent = os.getppid() + 1_000_000  # no such process is this process's parent
    thread, codes = _start(endpoint, not_our_parent)
    _wait_ready(sock)
    thread.join(30)
    assert not thread.is_alive() and codes == [0]
