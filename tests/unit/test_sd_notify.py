"""sd_notify without libsystemd: addresses, the watchdog period, and what the notifier sends when."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zinfer.broker import cli
from zinfer.broker.sd_notify import Notifier, notify_address, watchdog_interval


@pytest.fixture(params=["path", "abstract"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for systemd, and the NOTIFY_SOCKET value that names it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        value = str(tmp_path / "notify")
        sock.bind(value)
    else:
        value = f"@zinfer-test-{secrets.token_hex(6)}"
        sock.bind("\0" + value[1:])
    sock.settimeout(0)
    yield sock, value
    sock.close()


def _received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_addresses() -> None:
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@abstract/name") == "\0abstract/name"
    assert notify_address("vsock:2:1234") is None
    assert notify_address("relative") is None
    assert notify_address("") is None
    assert notify_address(None) is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "20000000"}, 10.0),
        ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "4242"}, 0.25),
        ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "4243"}, None),  # the parent's watchdog, not ours
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "ten"}, None),
        ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env, pid=4242) == expected


def test_watchdog_pid_defaults_to_this_process() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0


def test_from_environment_takes_the_variables_out(manager: tuple[socket.socket, str]) -> None:
    _, value = manager
    env = {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()), "X": "1"}
    notifier = Notifier.from_environment(env)
    assert notifier.enabled and notifier.interval == 0.5
    assert env == {"X": "1"}, "worker processes must not inherit the notify socket"
    kept = {"NOTIFY_SOCKET": value}
    assert Notifier.from_environment(kept, unset=False).enabled
    assert kept == {"NOTIFY_SOCKET": value}


def test_without_notify_socket_nothing_happens() -> None:
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled and notifier.interval is None
    assert notifier.send("READY=1") is False
    notifier.loop_tick(0.0, True, "serving")
    notifier.stopping()
    assert not notifier.ready_sent
    notifier.close()


def test_the_sequence_a_service_manager_sees(manager: tuple[socket.socket, str]) -> None:
    sock, value = manager
    notifier = Notifier(notify_address(value), interval=1.0)
    notifier.loop_tick(0.0, False, "loading 2 model(s): add, linear")
    assert _received(sock) == ["STATUS=loading 2 model(s): add, linear", "WATCHDOG=1"]
    notifier.loop_tick(0.5, False, "loading 2 model(s): add, linear")
    assert _received(sock) == []  # same status, ping not due
    notifier.loop_tick(0.9, False, "loading 1 model(s): linear\n; 1 ready")
    assert _received(sock) == ["STATUS=loading 1 model(s): linear ; 1 ready"]  # one line
    notifier.loop_tick(1.2, True, "serving 2 model(s)")
    assert _received(sock) == ["READY=1\nSTATUS=serving 2 model(s)", "WATCHDOG=1"]
    assert notifier.ready_sent
    for t in (1.3, 1.8, 2.1, 2.3):
        notifier.loop_tick(t, True, "serving 2 model(s)")
    assert _received(sock) == ["WATCHDOG=1"]  # at 2.2 and later: once per second, READY only once
    notifier.stopping("draining")
    notifier.stopping("draining again")
    assert _received(sock) == ["STOPPING=1\nSTATUS=draining"]
    notifier.loop_tick(3.5, True, "draining")
    assert _received(sock) == ["WATCHDOG=1"]  # the drain keeps pinging
    notifier.close()


def test_no_ready_after_stopping(manager: tuple[socket.socket, str]) -> None:
    sock, value = manager
    notifier = Notifier(notify_address(value))
    notifier.loop_tick(0.0, False, "loading")
    notifier.stopping("stopping before the models loaded")
    notifier.loop_tick(1.0, True, "serving")
    assert _received(sock) == ["STATUS=loading", "STOPPING=1\nSTATUS=stopping before the models loaded",
                               "STATUS=serving"]  # fmt: skip
    assert not notifier.ready_sent
    notifier.close()


def test_a_full_queue_drops_pings_and_retries_ready(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0)
    notifier = Notifier(str(tmp_path / "notify"), interval=1.0)
    for _ in range(100_000):
        if not notifier.send("STATUS=filler"):
            break
    else:
        pytest.skip("the datagram queue never filled")
    notifier.loop_tick(0.0, True, "serving")  # neither READY nor the ping gets through; no exception
    assert not notifier.ready_sent
    _received(sock)
    notifier.loop_tick(0.1, True, "serving")
    assert _received(sock) == ["READY=1\nSTATUS=serving", "WATCHDOG=1"]
    sock.close()
    notifier.close()


def test_a_missing_manager_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier(str(tmp_path / "nobody"), interval=0.1)
    with caplog.at_level(logging.WARNING):
        for t in range(5):
            notifier.loop_tick(float(t), True, "serving")
    notifier.close()
    assert not notifier.ready_sent
    assert [r.message for r in caplog.records if "notify_failed" in r.message] == [
        f"event=notify_failed address={str(tmp_path / 'nobody')!r} error='No such file or directory'"
    ]


def test_unsupported_address_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert not Notifier.from_environment({"NOTIFY_SOCKET": "vsock:2:99"}).enabled
    assert "notify_socket_unsupported" in caplog.text


# ---------------------------------------------------------------------------------------------- wiring


def _broker(pending: list[str], ready: list[str], failed: list[str], draining: bool = False) -> Any:
    states = [SimpleNamespace(name=n, ready=True, error=None) for n in ready]
    states += [SimpleNamespace(name=n, ready=False, error="boom") for n in failed]
    return SimpleNamespace(
        registry=SimpleNamespace(states=lambda: iter(states), load_errors={"missing": "no such model"}),
        control=SimpleNamespace(pending=[SimpleNamespace(name=n) for n in pending]),
        draining_since=1.0 if draining else None,
        startup_done=not pending,
    )


def test_serving_status_lines() -> None:
    assert cli.serving_status(_broker(["slow"], ["add"], [])) == (
        "loading 1 model(s): slow; 1 ready; failed: missing"
    )
    assert cli.serving_status(_broker([], ["add", "identity"], ["bad"])) == (
        "serving 2 model(s); failed: bad, missing"
    )
    many = [f"m{i:02d}" for i in range(12)]
    assert "m07 and 4 more" in cli.serving_status(_broker(many, [], []))
    assert cli.serving_status(_broker([], ["add"], [], draining=True)).startswith("draining")


def test_the_loop_callable_reports_and_counts_stops(
    manager: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, value = manager
    notifier = Notifier(notify_address(value), interval=30.0)
    broker = _broker(["slow"], [], [])
    stop = {"signal": 0, "count": 0}
    tick = cli._reporting(notifier, broker, stop)
    assert tick() == 0
    assert _received(sock) == ["STATUS=loading 1 model(s): slow; 0 ready; failed: missing", "WATCHDOG=1"]
    broker.control.pending, broker.startup_done = [], True
    broker.registry = SimpleNamespace(states=lambda: iter([]), load_errors={})
    monkeypatch.setattr(cli, "NOTIFY_TICK_S", 0.0)
    assert tick() == 0
    assert _received(sock) == ["READY=1\nSTATUS=serving 0 model(s)"]
    stop["count"] = 1
    assert tick() == 1
    assert _received(sock)[0].startswith("STOPPING=1\nSTATUS=draining")
    notifier.close()


def test_the_loop_callable_without_systemd_only_counts() -> None:
    stop = {"signal": 0, "count": 2}
    assert cli._reporting(Notifier(None), _broker([], [], []), stop)() == 2
