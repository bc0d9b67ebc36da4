"""``broker/precise_wait.py``: sub-millisecond waits over a real ZeroMQ socket pair; no elapsed-time checks
(how close a deadline is kept is measured by ``bench/bench_queue_delay.py``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import zmq

from tests.conftest import ROOT
from zinfer.broker import precise_wait
from zinfer.broker.precise_wait import PreciseWait


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    url = f"inproc://precise-{uuid.uuid4().hex}"
    a.bind(url)
    b.connect(url)
    try:
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)


def _waiter(sock: zmq.Socket[bytes]) -> PreciseWait:
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    return PreciseWait(poller)


@pytest.mark.parametrize("timeout_ms", [0.0, 0.02, 0.3, 0.9, 1.0, 2.5])
def test_nothing_there_is_no_event(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    a, _ = pair
    assert _waiter(a).poll(timeout_ms) == {}


@pytest.mark.parametrize("timeout_ms", [0.0, 0.02, 0.3, 0.9, 1.0, 2.5])
def test_a_waiting_message_is_never_missed_even_after_its_edge_was_taken(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    """ZMQ_FD is edge-triggered: a poll that saw the message and left it unread takes the edge, so a wait
    that went straight to select would sleep past a message that is there."""
    a, b = pair
    b.send(b"x")
    w = _waiter(a)
    assert dict(w.poller.poll(1000)) == {a: zmq.POLLIN}  # takes the edge, leaves the message
    assert w.poll(timeout_ms) == {a: zmq.POLLIN}
    assert a.recv(zmq.NOBLOCK) == b"x"


def test_a_descriptor_select_cannot_take_falls_back_to_a_millisecond_poll(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    monkeypatch.setattr(precise_wait, "_SELECT_LIMIT", 0)
    w = _waiter(a)
    assert w.poll(0.5) == {}
    b.send(b"y")
    assert dict(w.poller.poll(1000)) == {a: zmq.POLLIN}  # it has landed
    assert w.poll(0.5) == {a: zmq.POLLIN}
    assert a.recv(zmq.NOBLOCK) == b"y"


def test_raw_descriptors_in_the_poller_are_still_polled(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    import os

    a, _ = pair
    r, w_fd = os.pipe()
    try:
        w = _waiter(a)
        w.poller.register(r, zmq.POLLIN)
        os.write(w_fd, b"z")
        assert w.poll(0.5) == {r: zmq.POLLIN}
    finally:
        os.close(r)
        os.close(w_fd)


def test_the_timer_slack_becomes_one_microsecond() -> None:
    code = (
        "from zinfer.broker.precise_wait import tighten_timer_slack as t; "
        "assert t(); print(open('/proc/self/timerslack_ns').read().strip())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1000"
