"""Triton's queue policies over a real server: priorities, timeouts, queue size, ordering, cancellation."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, start_server, wait_for
from zinfer.client import Client
from zinfer.client.errors import Cancelled, DeadlineExceeded, InvalidArgument, RequestTimeout, Unavailable

pytestmark = pytest.mark.integration


SLOW_ADD = """
import time


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        time.sleep(0.15)  # a slow instance: requests queue behind it
        return {"OUTPUT_SUM": inputs["INPUT_A"] + inputs["INPUT_B"]}
"""


def _model(repo: Path, name: str, dynamic_batching: str, max_batch_size: int = 1, slow: bool = False) -> None:
    """An ``add`` model with the given ``dynamic_batching`` block; ``slow`` runs it as a Python model that
    takes 150 ms a batch."""
    shutil.copytree(MODELS / "add", repo / name)
    cfg = (repo / name / "config.pbtxt").read_text()
    start, end = cfg.index("dynamic_batching"), cfg.index("}", cfg.index("dynamic_batching")) + 1
    cfg = cfg[:start] + f"dynamic_batching {{ {dynamic_batching} }}" + cfg[end:]
    cfg = cfg.replace('name: "add"', f'name: "{name}"')
    cfg = cfg.replace("max_batch_size: 16", f"max_batch_size: {max_batch_size}")
    if slow:
        cfg = cfg.replace('backend: "zinfer"', 'backend: "python"')
        cfg = cfg.replace('parameters { key: "kernel" value: { string_value: "add" } }', "")
        (repo / name / "1" / "model.py").write_text(SLOW_ADD)
    (repo / name / "config.pbtxt").write_text(cfg)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sched")
    _model(repo, "prio", "priority_levels: 2 default_priority_level: 2", 1, slow=True)
    _model(repo, "timeouts", "max_queue_delay_microseconds: 2000000 default_queue_policy { "
           "default_timeout_microseconds: 200000 allow_timeout_override: true }", 4)  # fmt: skip
    _model(repo, "bounded", "default_queue_policy { max_queue_size: 2 }", 1, slow=True)
    _model(repo, "ordered", "preserve_ordering: true", 1)
    _model(repo, "cancel", "max_queue_delay_microseconds: 3000000", 8)
    _model(repo, "adaptive", "zinfer_latency_target_microseconds: 100000", 8, slow=True)
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()


def _ab(v: float) -> dict[str, np.ndarray]:
    a = np.full((1, 1), v, np.float32)
    return {"INPUT_A": a, "INPUT_B": a}


def _warm_clients(server: ServerProcess, model: str, n: int) -> list[Client]:
    """Clients that already know the model's metadata, so their next call is one message."""
    clients = [Client(server.url, timeout=30) for _ in range(n)]
    for c in clients:
        c._model_info(model, 0)
    return clients


def _in_threads(calls: list[Callable[[], object]]) -> list[object]:
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
        time.sleep(0.02)  # arrival order
    for t in threads:
        t.join(30)
    return out


def test_higher_priority_goes_first(server: ServerProcess) -> None:
    order: list[str] = []
    lock = threading.Lock()

    clients = _warm_clients(server, "prio", 3)

    def call(c: Client, tag: str, priority: int) -> Callable[[], object]:
        def go() -> object:
            c.infer("prio", _ab(1), priority=priority)
            with lock:
                order.append(tag)
            return tag

        return go

    # "busy" takes the instance; "low" then "high" queue behind it, and "high" leaves first
    calls = [call(clients[0], "busy", 2), call(clients[1], "low", 0), call(clients[2], "high", 1)]
    results = _in_threads(calls)
    for c in clients:
        c.close()
    assert not [r for r in results if isinstance(r, Exception)], results
    assert order == ["busy", "high", "low"]
    with Client(server.url, timeout=30) as c:
        with pytest.raises(InvalidArgument, match="priority"):
            c.infer("prio", _ab(1), priority=3)


def test_queue_timeout_rejects_promptly(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="timeout"):
            c.infer("timeouts", _ab(1))  # the policy's 200 ms default, long before the 2 s batch delay
        assert 0.15 < time.monotonic() - start < 1.5
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            c.infer("timeouts", _ab(1), timeout=50_000)  # the override may only shorten it
        assert time.monotonic() - start < 0.2 + 0.5
        stats = c.statistics("timeouts")["model_stats"][0]
        assert stats["inference_stats"]["fail"]["count"] == 2


def test_max_queue_size_rejects_at_once(server: ServerProcess) -> None:
    clients = _warm_clients(server, "bounded", 5)

    def call(c: Client) -> Callable[[], object]:
        return lambda: c.infer("bounded", _ab(1)).as_numpy("OUTPUT_SUM")[0, 0]

    # one runs, two wait in the queue, the rest are refused the moment they arrive
    results = _in_threads([call(c) for c in clients])
    for c in clients:
        c.close()
    refused = [r for r in results if isinstance(r, Unavailable)]
    served = [r for r in results if r == 2.0]
    assert len(refused) == 2 and len(served) == 3, results
    assert all("maximum queue size" in str(r) for r in refused)


def test_responses_keep_arrival_order(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        for i in range(20):
            assert c.infer("ordered", _ab(i)).as_numpy("OUTPUT_SUM")[0, 0] == 2 * i


def test_cancel_takes_a_request_out_of_the_queue(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        results = []
        t = threading.Thread(
            target=lambda: results.append(_catch(lambda: c.infer("cancel", _ab(1), request_id="r1")))
        )
        t.start()
        wait_for(lambda: "r1" in c._active, 5, "the request to be sent")
        time.sleep(0.1)
        assert c.cancel("r1")
        t.join(10)
        assert isinstance(results[0], Cancelled)
        assert not c.cancel("r1")  # no longer in flight


def test_client_timeout_cancels_in_the_server(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        with pytest.raises(RequestTimeout):
            c.infer("cancel", _ab(1), client_timeout=0.2)
        wait_for(lambda: _cancelled(server) >= 2, 5, "the server to count the cancellation")
        assert c.statistics("cancel")["model_stats"][0]["execution_count"] == 0


def _cancelled(server: ServerProcess) -> float:
    import urllib.request

    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("zinfer_requests_cancelled") and 'model="cancel"' in line)  # fmt: skip


def _catch(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc


def test_adaptive_mode_reports_what_it_learned_and_an_unreachable_target(server: ServerProcess) -> None:
    """A 100 ms target on a model that takes 150 ms a batch cannot be met: the statistics say so."""
    clients = _warm_clients(server, "adaptive", 8)
    try:
        calls = [lambda c=c: [c.infer("adaptive", _ab(1.0)) for _ in range(5)] for c in clients]
        results = _in_threads(calls)  # type: ignore[misc]
        assert not [r for r in results if isinstance(r, Exception)], results
        with Client(server.url) as c:
            stats = c.statistics("adaptive")["model_stats"][0]
            assert "adaptive" not in c.statistics("ordered")["model_stats"][0]
    finally:
        for c in clients:
            c.close()
    a = stats["adaptive"]
    assert a["target_us"] == 100000
    assert a["observed"] >= 40 and a["observed_misses"] >= 40  # every request took over 150 ms
    assert a["observed_p99_us"] is not None and a["observed_p99_us"] > 100000
    assert a["exec_fixed_us"] is not None and a["exec_fixed_us"] + a["exec_per_item_us"] > 100000
    assert a["target_unreachable"] is True
