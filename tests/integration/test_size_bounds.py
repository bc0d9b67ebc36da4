"""Issue 13, item 8: sizes are bounded before buffering. A frame over the tensor limit is dropped by libzmq
(``MAXMSGSIZE``) as soon as its size is announced, so the broker never holds it; the input bytes of one batch
are bounded by ``--max-batch-bytes``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, wait_for
from zinfer.client import Client, protocol
from zinfer.client.errors import ResourceExhausted
from zinfer.client.protocol import Command

pytestmark = pytest.mark.integration

MiB = 1 << 20
ONE = np.ones((1, 1), np.float32)


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_1_gib_frame_is_dropped_before_the_broker_buffers_it(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(MODELS, "--max-tensor-bytes", str(64 * MiB))
    broker = psutil.Process(server.proc.pid)
    rss_before = broker.memory_info().rss
    big = np.zeros(1 << 30, np.uint8)  # untouched zero pages: cheap to send
    tensor = {"name": "INPUT0", "datatype": "UINT8", "shape": [1, 1 << 30], "frame": 0}
    header = {"id": "big", "model": "identity", "version": 0, "outputs": None, "inputs": [tensor]}
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(server.url)
        sock.send_multipart(protocol.encode(Command.INFER, header, [big.data]), copy=False)
        assert monitor.poll(30_000), "the broker did not drop the connection that sent a 1 GiB frame"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    peak = _peak_rss(broker.pid)
    assert peak < rss_before + 128 * MiB, f"peak RSS {peak // MiB} MiB, {rss_before // MiB} MiB before"
    with Client(server.url, timeout=30) as client:  # and it goes on serving
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        np.testing.assert_array_equal(client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)


def test_a_batch_closes_before_it_passes_max_batch_bytes(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Each request carries 8 input bytes (two float32 rows); with --max-batch-bytes 24 a batch holds at most
    three of them, although max_batch_size is 16 and all eight wait together in the queue."""
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    cfg = (repo / "add" / "config.pbtxt").read_text()
    (repo / "add" / "config.pbtxt").write_text(
        cfg.replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 300000") + TRITON_TIMING
    )
    server = server_factory(repo, "--max-batch-bytes", "24")
    with Client(server.url, timeout=30) as client:
        with ThreadPoolExecutor(8) as pool:
            sums = list(
                pool.map(lambda i: client.infer("add", {"INPUT_A": ONE * i, "INPUT_B": ONE}), range(8))
            )
        assert [float(r.as_numpy("OUTPUT_SUM")[0, 0]) for r in sums] == [i + 1.0 for i in range(8)]
        stats = client.statistics("add")["model_stats"][0]
        sizes = {int(b["batch_size"]): int(b["count"]) for b in stats["batch_stats"]}
        assert sum(size * count for size, count in sizes.items()) == 8
        assert max(sizes) == 3, sizes  # cut by bytes, not by max_batch_size
        # a request over the limit on its own is refused at admission
        four = np.ones((4, 1), np.float32)  # 2 inputs x 16 bytes = 32 > 24
        with pytest.raises(ResourceExhausted, match="limit of one batch"):
            client.infer("add", {"INPUT_A": four, "INPUT_B": four})
        wait_for(lambda: client.is_server_ready(), 5, "the server to stay ready")
