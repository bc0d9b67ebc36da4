"""A RESULT whose largest inline output passes the broker's frame limit (``max_frame_bytes``, which would
drop the worker's connection) fails its requests with ResourceExhausted instead; frames within the limit,
memoryviews and bytes alike, go as they are."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import MODELS
from zinfer.client.errors import Status
from zinfer.client.protocol import TensorRef
from zinfer.client.worker_protocol import RequestResult, WorkerResult, decode_result
from zinfer.workers.worker import Worker, WorkerArgs

LIMIT = 4096  # a real limit is larger still: the ZMTP handshake itself must pass it


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], Worker]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    endpoint = f"ipc://{tmp_path / 'w.sock'}"
    sock.bind(endpoint)
    args = WorkerArgs(endpoint, MODELS, "add", 1, 0, "cpu", b"w-lim", os.getppid(), max_frame_bytes=LIMIT)
    worker = Worker(args)
    try:
        yield sock, worker
    finally:
        worker.close()
        sock.close(linger=0)
        ctx.term()


def _sent(sock: zmq.Socket[bytes], worker: Worker, frames: list[Any]) -> tuple[WorkerResult, list[Any]]:
    outs = tuple(TensorRef(f"Y{i}", "UINT8", (len(bytes(f)),), frame=i) for i, f in enumerate(frames))
    worker.send_result(WorkerResult(3, (RequestResult(0, outputs=outs), RequestResult(1))), frames)
    while True:
        who, *raw = sock.recv_multipart()
        got = decode_result(raw)
        if who == b"w-lim" and got is not None:
            return got.record, got.frames


@pytest.mark.parametrize("kind", [bytes, memoryview])
def test_frames_within_the_limit_go_as_they_are(pair: tuple[zmq.Socket[bytes], Worker], kind: Any) -> None:
    result, frames = _sent(*pair, [kind(b"x" * LIMIT), kind(b"ab")])
    assert [r.status for r in result.results] == [Status.OK, Status.OK]
    assert [bytes(f) for f in frames] == [b"x" * LIMIT, b"ab"]


@pytest.mark.parametrize("kind", [bytes, memoryview])
def test_a_frame_over_the_limit_fails_every_request(
    pair: tuple[zmq.Socket[bytes], Worker], kind: Any
) -> None:
    result, frames = _sent(*pair, [kind(b"ab"), kind(b"x" * (LIMIT + 1))])
    assert [r.status for r in result.results] == [Status.RESOURCE_EXHAUSTED] * 2
    assert f"an output of {LIMIT + 1} bytes is over the {LIMIT} byte frame limit" in result.results[0].error
    assert frames == [] and result.batch == 3
