"""Triton's queue policies over a real server: priorities, timeouts, queue size, ordering, cancellation."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, start_server, wait_for
from tests.gated import Gate, gated_model, metric, pending
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


def _model(
    repo: Path,
    name: str,
    dynamic_batching: str,
    max_batch_size: int = 1,
    slow: bool = False,
    triton_timing: bool = False,
) -> None:
    """An ``add`` model with the given ``dynamic_batching`` block; ``slow`` runs it as a Python model that
    takes 150 ms a batch; ``triton_timing`` turns early dispatch off (tests that hold requests with the
    delay)."""
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
    (repo / name / "config.pbtxt").write_text(cfg + (TRITON_TIMING if triton_timing else ""))


GATES: dict[str, Gate] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sched")
    GATES["prio"] = gated_model(repo, "prio", "priority_levels: 2 default_priority_level: 2")
    GATES["busy"] = gated_model(repo, "busy", "default_queue_policy { default_timeout_microseconds: 200000 "
                                "allow_timeout_override: true }")  # fmt: skip
    GATES["bounded"] = gated_model(repo, "bounded", "default_queue_policy { max_queue_size: 2 }")
    GATES["ordered"] = gated_model(repo, "ordered", "preserve_ordering: true", count=2)
    _model(repo, "timeouts", "max_queue_delay_microseconds: 1000000 default_queue_policy { "
           "default_timeout_microseconds: 5000000 allow_timeout_override: true }", 4,
           triton_timing=True)  # fmt: skip
    _model(repo, "cancel", "max_queue_delay_microseconds: 3000000", 8, triton_timing=True)
    _model(repo, "adaptive", "zinfer_latency_target_microseconds: 100000", 8, slow=True)
    _model(repo, "loop", "max_queue_delay_microseconds: 100000", 8)
    _model(repo, "loop_triton", "max_queue_delay_microseconds: 100000", 8, triton_timing=True)
    s = start_server(repo)
    try:
        yield s
    finally:
        for gate in GATES.values():
            gate.release_all()  # a failed test leaves no instance waiting
        assert s.stop() == 0, s.log()


@pytest.fixture
def gate(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Gate]:
    """The gate of the model the test names in ``@pytest.mark.parametrize("gate", [...], indirect=True)``."""
    g = GATES[request.param]
    g.reset()
    try:
        yield g
    finally:
        g.release_all()


def _ab(v: float) -> dict[str, np.ndarray]:
    a = np.full((1, 1), v, np.float32)
    return {"INPUT_A": a, "INPUT_B": a}


def _warm_clients(stack: ExitStack, server: ServerProcess, model: str, n: int) -> list[Client]:
    """Clients (closed with ``stack``) that already know the model's metadata, so each call is one message."""
    clients = [stack.enter_context(Client(server.url, timeout=30)) for _ in range(n)]
    for c in clients:
        c._model_info(model, 0)
    return clients


class _Calls:
    """Calls running in threads, each started when the test says; results (or exceptions) by tag, and the
    order their replies reached the client."""

    def __init__(self) -> None:
        self.results: dict[int, object] = {}
        self.replied: list[int] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, tag: int, fn: Callable[[], object]) -> None:
        def run() -> None:
            try:
                out: object = fn()
            except Exception as exc:
                out = exc
            with self._lock:
                self.results[tag] = out
                self.replied.append(tag)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def join(self, timeout: float = 30) -> None:
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "a call never returned"


def _sum(c: Client, model: str, tag: int, **kw: object) -> Callable[[], object]:
    return lambda: c.infer(model, _ab(tag), **kw).as_numpy("OUTPUT_SUM")[0, 0]  # type: ignore[arg-type]


@pytest.mark.parametrize("gate", ["prio"], indirect=True)
def test_higher_priority_goes_first(server: ServerProcess, gate: Gate) -> None:
    """1 takes the instance; 2 (low) then 3 (high) queue behind it; 3 runs before 2."""
    calls = _Calls()
    with ExitStack() as stack:
        busy, low, high = _warm_clients(stack, server, "prio", 3)
        calls.start(1, _sum(busy, "prio", 1, priority=2))
        gate.wait_started(1)
        calls.start(2, _sum(low, "prio", 2, priority=0))  # 0: the model's default (2, the lowest)
        wait_for(lambda: pending(server, "prio") == 1, 10, "the low-priority request to queue")
        calls.start(3, _sum(high, "prio", 3, priority=1))
        wait_for(lambda: pending(server, "prio") == 2, 10, "the high-priority request to queue")
        gate.release_all()
        calls.join()
    assert calls.results == {1: 2.0, 2: 4.0, 3: 6.0}
    assert gate.order() == [1, 3, 2]
    with Client(server.url, timeout=30) as c:
        with pytest.raises(InvalidArgument, match="priority"):
            c.infer("prio", _ab(1), priority=3)


@pytest.mark.parametrize("gate", ["busy"], indirect=True)
def test_queue_timeout_rejects_while_every_instance_is_busy(server: ServerProcess, gate: Gate) -> None:
    """Row 3: the one instance is held busy for the whole test; the queued request is still rejected by its
    200 ms queue timeout (not served late, not left to the client's own timeout), and an override may only
    shorten that timeout, never lengthen it."""
    calls = _Calls()
    with ExitStack() as stack:
        holder, c = _warm_clients(stack, server, "busy", 2)
        calls.start(1, _sum(holder, "busy", 1))
        gate.wait_started(1)
        for timeout_us in (0, 60_000_000):  # the default, then an override asking for a minute
            with pytest.raises(DeadlineExceeded, match="timeout"):
                c.infer("busy", _ab(7), timeout=timeout_us, client_timeout=10)
            assert not gate.done(1) and not gate.started(7)  # rejected while the instance was still busy
        gate.release(1)
        calls.join()
        assert calls.results == {1: 2.0}
        assert c.statistics("busy")["model_stats"][0]["inference_stats"]["fail"]["count"] == 2


def test_queue_timeout_override_shortens(server: ServerProcess) -> None:
    """The model's 5 s queue timeout outlasts its 1 s batch delay, so a lone request is served; asking for
    50 ms gets it rejected before the delay is over."""
    with Client(server.url, timeout=30) as c:
        assert c.infer("timeouts", _ab(1)).as_numpy("OUTPUT_SUM")[0, 0] == 2.0
        with pytest.raises(DeadlineExceeded, match="timeout"):
            c.infer("timeouts", _ab(1), timeout=50_000)


@pytest.mark.parametrize("gate", ["bounded"], indirect=True)
def test_max_queue_size_rejects_at_once(server: ServerProcess, gate: Gate) -> None:
    """1 runs (held), 2 and 3 fill the queue of 2; 4 and 5 are refused while the instance is still held."""
    calls = _Calls()
    with ExitStack() as stack:
        clients = _warm_clients(stack, server, "bounded", 5)
        calls.start(1, _sum(clients[0], "bounded", 1))
        gate.wait_started(1)
        for tag in (2, 3):
            calls.start(tag, _sum(clients[tag - 1], "bounded", tag))
            wait_for(lambda tag=tag: pending(server, "bounded") == tag - 1, 10, f"request {tag} to queue")
        for tag in (4, 5):
            with pytest.raises(Unavailable, match="maximum queue size"):
                clients[tag - 1].infer("bounded", _ab(tag), client_timeout=10)
        assert not gate.done(1)
        gate.release_all()
        calls.join()
    assert calls.results == {1: 2.0, 2: 4.0, 3: 6.0}


@pytest.mark.parametrize("gate", ["ordered"], indirect=True)
def test_responses_keep_arrival_order(server: ServerProcess, gate: Gate) -> None:
    """preserve_ordering with two instances: 1 and 2 run at once, 2 finishes first, yet 1's reply leaves
    first; 2's reply is held while 1 runs (given half a second to escape, it does not)."""
    calls = _Calls()
    with ExitStack() as stack:
        first, second = _warm_clients(stack, server, "ordered", 2)
        calls.start(1, _sum(first, "ordered", 1))
        gate.wait_started(1)
        calls.start(2, _sum(second, "ordered", 2))
        gate.wait_started(2)  # on the other instance
        gate.release(2)
        wait_for(lambda: gate.done(2), 10, "request 2 to finish on its instance")
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: bool(calls.replied), 0.5, "a reply before request 1 finished")
        gate.release(1)
        calls.join()
    assert calls.results == {1: 2.0, 2: 4.0}
    # Once 1 finishes, both replies leave back to back to two connections read by two threads: which thread
    # records first is a race of the test, not of the server. The order is proven above (2 held while 1 ran).
    assert sorted(calls.replied) == [1, 2]


def test_cancel_takes_a_request_out_of_the_queue(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        c._model_info("cancel", 0)
        calls = _Calls()
        calls.start(1, lambda: c.infer("cancel", _ab(1), request_id="r1"))
        wait_for(lambda: pending(server, "cancel") == 1, 10, "the request to wait in the queue")
        assert c.cancel("r1")
        calls.join(10)  # long before its 3 s batch delay would have sent it
        assert isinstance(calls.results[1], Cancelled)
        assert not c.cancel("r1")  # no longer in flight
        assert c.statistics("cancel")["model_stats"][0]["execution_count"] == 0


def test_the_pending_gauge_drops_a_cancelled_request_before_its_answer_leaves(server: ServerProcess) -> None:
    """The gauge is set when the queue changes, not on the next periodic snapshot: read at once after the
    Cancelled answer (no waiting), it already says 0. Three rounds, each first seeing the request queued."""
    with Client(server.url, timeout=30) as c:
        c._model_info("cancel", 0)
        for round_ in range(3):
            calls, rid = _Calls(), f"g{round_}"
            calls.start(1, lambda rid=rid: c.infer("cancel", _ab(1), request_id=rid))  # type: ignore[misc]
            wait_for(lambda: pending(server, "cancel") == 1, 10, "the request to wait in the queue")
            assert c.cancel(rid)
            calls.join(10)
            assert isinstance(calls.results[1], Cancelled)
            assert pending(server, "cancel") == 0, f"round {round_}: the gauge still counts the cancelled one"


@pytest.mark.parametrize("gate", ["busy"], indirect=True)
def test_the_pending_gauge_drops_a_timed_out_request_before_its_answer_leaves(
    server: ServerProcess, gate: Gate
) -> None:
    """The only instance is held busy; a request waits in the queue until its 200 ms queue timeout; read at
    once after its DeadlineExceeded, the gauge says 0. Three rounds."""
    calls = _Calls()
    with ExitStack() as stack:
        holder, c = _warm_clients(stack, server, "busy", 2)
        calls.start(1, _sum(holder, "busy", 1))
        gate.wait_started(1)
        for round_ in range(3):
            waiting = _Calls()
            waiting.start(7, lambda: c.infer("busy", _ab(7), client_timeout=10))
            waiting.join(10)  # a queue timeout only ever rejects a request that waits in the queue
            assert isinstance(waiting.results[7], DeadlineExceeded), waiting.results
            assert pending(server, "busy") == 0, f"round {round_}: the gauge still counts the expired request"
        assert not gate.done(1) and not gate.started(7)  # it expired in the queue while the instance was busy
        gate.release(1)
        calls.join()
        assert calls.results == {1: 2.0}


def test_client_timeout_cancels_in_the_server(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        with pytest.raises(RequestTimeout):
            c.infer("cancel", _ab(1), client_timeout=0.2)
        cancelled = lambda: metric(server, "zinfer_requests_cancelled_total", "cancel")  # noqa: E731
        wait_for(lambda: cancelled() >= 2, 5, "the server to count the cancellation")
        assert c.statistics("cancel")["model_stats"][0]["execution_count"] == 0


def test_adaptive_mode_reports_what_it_learned_and_an_unreachable_target(server: ServerProcess) -> None:
    """A 100 ms target on a model that takes 150 ms a batch cannot be met: the statistics say so."""
    calls = _Calls()
    with ExitStack() as stack:
        clients = _warm_clients(stack, server, "adaptive", 8)
        for i, c in enumerate(clients):
            calls.start(i, lambda c=c: [c.infer("adaptive", _ab(1.0)) for _ in range(5)])  # type: ignore[misc]
        calls.join()
        assert not [r for r in calls.results.values() if isinstance(r, Exception)], calls.results
        stats = clients[0].statistics("adaptive")["model_stats"][0]
        assert "adaptive" not in clients[0].statistics("ordered")["model_stats"][0]
    a = stats["adaptive"]
    assert a["target_us"] == 100000
    assert a["observed"] >= 40 and a["observed_misses"] >= 40  # every request took over 150 ms
    assert a["observed_p99_us"] is not None and a["observed_p99_us"] > 100000
    assert a["exec_fixed_us"] is not None and a["exec_fixed_us"] + a["exec_per_item_us"] > 100000
    assert a["target_unreachable"] is True


def test_one_client_in_a_loop_stops_waiting_for_the_queue_delay(server: ServerProcess) -> None:
    """Requests one at a time against a 100 ms delay: no companion can come, so after the first few the
    batcher sends each at once (reason early_no_companion) instead of holding it 100 ms."""
    with ExitStack() as stack:
        [c] = _warm_clients(stack, server, "loop", 1)
        for i in range(12):
            assert c.infer("loop", _ab(i)).as_numpy("OUTPUT_SUM")[0, 0] == 2 * i
        t0 = time.monotonic()
        for i in range(4):
            c.infer("loop", _ab(i))
        took = time.monotonic() - t0
        reasons = c.statistics("loop")["model_stats"][0]["batch_reasons"]
    assert reasons.get("early_no_companion", 0) >= 4, reasons
    assert set(reasons) <= {"early_no_companion", "delay_expired"}, reasons
    assert took < 0.4, f"4 calls took {took:.3f} s: they waited for the 100 ms delay"


def test_the_model_parameter_keeps_tritons_timing(server: ServerProcess) -> None:
    with ExitStack() as stack:
        [c] = _warm_clients(stack, server, "loop_triton", 1)
        for i in range(4):
            t0 = time.monotonic()
            c.infer("loop_triton", _ab(i))
            assert time.monotonic() - t0 >= 0.1  # every request waits the whole delay
        reasons = c.statistics("loop_triton")["model_stats"][0]["batch_reasons"]
    assert reasons == {"delay_expired": 4}
