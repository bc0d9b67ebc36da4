"""``broker/precise_wait.py``: sub-millisecond waits over a real ZeroMQ socket pair; no elapsed-time checks
(how close a deadline is kept is measured by ``bench/bench_queue_delay.py``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

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
    w = PreciseWait()
    w.register(sock)
    return w


@pytest.mark.parametrize("timeout_ms", [0.0, 0.02, 0.3, 0.9, 1.0, 2.5])
def test_nothing_there_is_no_event(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    a, _ = pair
    w = _waiter(a)
    assert w.poll(timeout_ms) == {}
    assert w.poll(timeout_ms) == {}  # nor after the first look


@pytest.mark.parametrize("timeout_ms", [0.0, 0.02, 0.3, 0.9, 1.0, 2.5])
def test_a_message_that_arrives_wakes_the_wait(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    """A socket not used since its EVENTS were asked: its descriptor says when a message comes."""
    a, b = pair
    w = _waiter(a)
    assert w.poll(0) == {}
    b.send(b"x")
    found: dict[object, int] = {}
    for _ in range(1000):  # inproc delivery is immediate, the descriptor too; bounded all the same
        found = w.poll(timeout_ms if timeout_ms else 1.0)
        if found:
            break
    assert found == {a: zmq.POLLIN}
    assert a.recv(zmq.NOBLOCK) == b"x"
    assert w.poll(0) == {}


@pytest.mark.parametrize("timeout_ms", [0.0, 0.02, 0.3, 0.9, 1.0, 2.5])
def test_a_waiting_message_is_never_missed_even_after_its_edge_was_taken(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    """ZMQ_FD is edge-triggered: a use of the socket (here a poll that saw the message and left it unread)
    takes the edge, so a wait that went straight to epoll would sleep past a message that is there. The
    socket was touched: its EVENTS are asked first."""
    a, b = pair
    w = _waiter(a)
    assert w.poll(0) == {}
    b.send(b"x")
    assert a.poll(1000) == zmq.POLLIN  # takes the edge, leaves the message
    w.touch(a)
    assert w.poll(timeout_ms) == {a: zmq.POLLIN}
    assert a.recv(zmq.NOBLOCK) == b"x"


def test_a_registered_socket_is_looked_at_first(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    b.send(b"x")
    assert a.poll(1000) == zmq.POLLIN  # the edge is gone before the socket is registered
    assert _waiter(a).poll(2.5) == {a: zmq.POLLIN}


def test_a_descriptor_select_cannot_take_falls_back_to_a_millisecond_wait(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    monkeypatch.setattr(precise_wait, "_SELECT_LIMIT", 0)
    w = _waiter(a)
    assert w.poll(0.5) == {}
    b.send(b"y")
    assert a.poll(1000) == zmq.POLLIN  # it has landed
    w.touch_all()
    assert w.poll(0.5) == {a: zmq.POLLIN}
    assert a.recv(zmq.NOBLOCK) == b"y"


@pytest.mark.parametrize("timeout_ms", [0.0, 0.5, 2.5])
def test_raw_descriptors_are_watched_too(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], timeout_ms: float
) -> None:
    import os

    a, _ = pair
    r, w_fd = os.pipe()
    try:
        w = _waiter(a)
        w.register(r)
        os.write(w_fd, b"z")
        assert w.poll(timeout_ms) == {r: zmq.POLLIN}
        w.unregister(r)
        assert w.poll(timeout_ms) == {}
        w.unregister(r)  # twice: nothing happens
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


class _Counting(zmq.Socket[bytes]):
    """A socket that counts how often its EVENTS are asked."""

    asked = 0

    def get(self, option: int) -> Any:
        if option == zmq.EVENTS:
            self.asked += 1
        return super().get(option)


def test_only_the_sockets_a_turn_used_are_asked_their_events(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    a, b = pair
    ctx = zmq.Context.instance()
    idle = ctx.socket(zmq.PAIR, socket_class=_Counting)
    idle.bind(f"inproc://precise-idle-{uuid.uuid4().hex}")
    try:
        w = _waiter(a)
        w.register(idle)
        assert w.poll(0) == {}  # the first look asks every registered socket
        before = idle.asked
        b.send(b"x")
        assert a.poll(1000) == zmq.POLLIN
        a.send(b"y")  # a use of the socket: it may take the message's wake-up from the descriptor
        w.touch_each([a, a])
        assert w.poll(0) == {a: zmq.POLLIN}
        assert idle.asked == before, "a socket nobody used was asked its EVENTS"
        assert a.recv(zmq.NOBLOCK) == b"x" and b.recv(zmq.NOBLOCK) == b"y"
    finally:
        idle.close(linger=0)


def test_recv_first_returns_a_woken_socket_unasked_and_a_receive_says_what_is_there(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    """``recv_first``: a socket whose descriptor woke the wait comes back unasked (0); the broker's drain
    receives without blocking, takes EAGAIN as nothing, and reads every message that is there."""
    from zinfer.broker.drain import drain

    a, b = pair
    ctx = zmq.Context.instance()
    counted = ctx.socket(zmq.PAIR, socket_class=_Counting)
    peer = ctx.socket(zmq.PAIR)
    url = f"inproc://precise-first-{uuid.uuid4().hex}"
    counted.bind(url)
    peer.connect(url)
    try:
        w = PreciseWait(recv_first=True)
        w.register(counted)
        assert w.poll(0) == {}  # registered sockets are asked once
        asked = counted.asked
        peer.send_multipart([b"id", b"one"])
        peer.send_multipart([b"id", b"two"])
        found: dict[object, int] = {}
        for _ in range(1000):  # bounded; inproc wakes the descriptor at once
            found = w.poll(1.0)
            if found:
                break
        assert found == {counted: 0} and counted.asked == asked  # woken, not asked
        got: list[tuple[bytes, list[bytes]]] = []
        keep = lambda who, frames: got.append((who, [bytes(f) for f in frames]))  # noqa: E731
        assert drain(counted, keep, b"T") is False
        assert got == [(b"Tid", [b"one"]), (b"Tid", [b"two"])]
        assert counted.asked == asked + 2  # after each message: is another there?
        assert drain(counted, lambda who, frames: got.append((who, [])), b"T") is False  # EAGAIN: nothing
        assert len(got) == 2
    finally:
        counted.close(linger=0)
        peer.close(linger=0)


def test_a_drain_reads_at_most_its_turns_share_and_says_more_are_left(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    from zinfer.broker.drain import MAX_PER_TURN, drain

    a, b = pair
    for i in range(MAX_PER_TURN + 44):
        b.send_multipart([b"id", str(i).encode()])
    assert a.poll(1000) == zmq.POLLIN
    got: list[bytes] = []
    assert drain(a, lambda who, frames: got.append(bytes(frames[0])), b"") is True
    assert len(got) == MAX_PER_TURN
    assert drain(a, lambda who, frames: got.append(bytes(frames[0])), b"") is False
    assert got == [str(i).encode() for i in range(MAX_PER_TURN + 44)]
