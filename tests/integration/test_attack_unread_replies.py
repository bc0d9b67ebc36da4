"""Issue 30, item 3: a client that never reads its replies cannot grow the broker.

The attack: a raw DEALER (``RCVHWM`` 1) registers a region holding a 4 MiB input, then sends 400 INFERs to
``identity`` whose 4 MiB outputs come back inline, and never reads. Before the fix the broker kept every
reply queued for that connection (RSS 93 -> 1,651 MiB). Now the bytes held for one connection are bounded
(``--max-unread-reply-bytes``, default 256 MiB): replies that would pass the limit are replaced by a small
``ResourceExhausted`` error, and the connection's new requests are refused while it is at the limit.
"""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import psutil
import pytest
import zmq

from tests.conftest import ServerProcess, wait_for
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.protocol import Command
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.shm import Segment

pytestmark = pytest.mark.integration

MIB = 1 << 20
N_REQUESTS = 400
OUTPUT_BYTES = 4 * MIB


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _answered(server: ServerProcess) -> float:
    """identity's requests answered so far (successes and failures), from /metrics."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{"))
        and 'model="identity"' in line
    )


def test_attack_unread_replies_a_client_that_never_reads_cannot_grow_the_broker(
    bundled_server: ServerProcess,
) -> None:
    server = bundled_server
    broker = server.proc.pid
    ctx = zmq.Context.instance()
    attacker = ctx.socket(zmq.DEALER)
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.setsockopt(zmq.RCVHWM, 1)
    attacker.connect(server.url)
    seg = Segment.create_sealed(OUTPUT_BYTES)
    try:
        np.frombuffer(seg.buf, np.float32)[:] = 1.0
        path = handoff_path(server.url)
        assert path is not None
        token = hand_over(path, seg.fd, 10.0)
        attacker.send_multipart(
            protocol.encode(Command.REGISTER, {"id": "r", "name": seg.name, "token": token})
        )
        assert attacker.poll(10_000), "no answer to REGISTER"
        reply = protocol.reply_from_wire(protocol.decode(attacker.recv_multipart()).header)
        assert reply.status == 0, reply.error
        with Client(server.url, timeout=30) as other:  # warm: the broker's baseline includes a served client
            x = np.ones((1, 16), np.float32)
            np.testing.assert_array_equal(other.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)
            before, answered = _rss(broker), _answered(server)
            n = OUTPUT_BYTES // 4
            tensor = {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, n],
                "shm": [seg.name, 0, OUTPUT_BYTES],
            }
            for i in range(N_REQUESTS):  # inputs in shared memory, outputs inline; never read
                header = {
                    "id": f"a{i}",
                    "model": "identity",
                    "inputs": [tensor],
                    "outputs": [{"name": "OUTPUT0"}],
                }
                attacker.send_multipart(protocol.encode(Command.INFER, header), flags=zmq.NOBLOCK)
            peak = before
            history = [answered]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until the broker has answered all it admitted
                time.sleep(0.25)
                peak = max(peak, _rss(broker))
                history.append(_answered(server))
                if len(history) > 8 and history[-1] == history[-8] > answered:
                    break
            peak = max(peak, _rss(broker))
            grown = (peak - before) / MIB
            # the default limit (256 MiB) plus one batch of results in flight (8 x 4 MiB) and allocator slack
            assert grown < 448, f"the broker grew by {grown:.0f} MiB for a client that never reads"
            # the other client is served, at once, while the attacker's replies sit unread
            t = time.monotonic()
            np.testing.assert_array_equal(other.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)
            assert time.monotonic() - t < 5.0
        wait_for(
            lambda: "event=reply_dropped reason=unread_replies" in server.log(), 10, "replies to be dropped"
        )
        # the attacker reads now: its answers are the outputs, then errors naming the limit
        statuses: dict[int, int] = {}
        refusal = ""
        while sum(statuses.values()) < N_REQUESTS and attacker.poll(3_000):
            r = protocol.reply_from_wire(protocol.decode(attacker.recv_multipart()).header)
            if r.request_id == protocol.PROBE_ID:  # the server's liveness probe
                continue
            statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status == protocol.Status.RESOURCE_EXHAUSTED:
                refusal = r.error
        assert statuses.get(0, 0) > 0, statuses
        assert "--max-unread-reply-bytes" in refusal, refusal
    finally:
        attacker.close(linger=0)
        seg.close()
