"""The front-door processes' supervision (broker/frontdoor_procs.py) with a stand-in command and an injected
clock: restarts after the workers' backoff, giving up after too many crashes, the command line, and a
previous server's registrations removed at start."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for
from zinfer.broker.cli import DOOR_POLL_INTERVAL_S, _with_frontdoors
from zinfer.broker.frontdoor_procs import FrontDoorConfig, FrontDoorProcs
from zinfer.broker.supervisor import RESTART_BACKOFF_S
from zinfer.client.addresses import listen_problem


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Exiting(FrontDoorConfig):
    """Processes that exit at once (a crash), instead of front doors."""

    def command(self, index: int) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit(3)"]


def _config(
    tmp_path: Path, cls: type[FrontDoorConfig] = FrontDoorConfig, workers: int = 1
) -> FrontDoorConfig:
    return cls(workers=workers, broker_url="ipc:///x/zinfer.sock", runtime_dir=tmp_path, grpc="127.0.0.1:1")


def test_the_command_line(tmp_path: Path) -> None:
    config = FrontDoorConfig(2, "ipc:///x/zinfer.sock", tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                             tls_cert=Path("/c"), tls_key=Path("/k"), insecure_remote=True,
                             max_tensor_bytes=9)  # fmt: skip
    cmd = config.command(1)
    assert cmd[1:3] == ["-m", "zinfer.frontdoor.process"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert pairs["--index"] == "1" and pairs["--grpc"] == "127.0.0.1:1" and pairs["--http"] == "127.0.0.1:2"
    assert pairs["--status-file"] == str(tmp_path / "frontdoor" / "1.json")
    assert pairs["--max-tensor-bytes"] == "9" and pairs["--tls-key"] == "/k"
    assert "--insecure-remote" in cmd and "--tls-client-ca" not in cmd and "--model-repository" not in cmd
    with_repo = FrontDoorConfig(1, "u", tmp_path, "127.0.0.1:1", model_repository=Path("/models")).command(0)
    assert with_repo[with_repo.index("--model-repository") + 1] == "/models"  # where label files are read
    assert not FrontDoorConfig(0, "u", tmp_path, grpc="127.0.0.1:1").enabled
    pinned = FrontDoorConfig(1, "u", tmp_path, "127.0.0.1:1", cpus=frozenset({3, 1})).command(0)
    assert pinned[pinned.index("--cpus") + 1] == "1,3"  # the door pins itself before its threads start
    assert "--cpus" not in cmd
    assert not FrontDoorConfig(1, "u", tmp_path).enabled


def test_a_crashed_process_is_restarted_after_backoff_then_given_up(tmp_path: Path) -> None:
    clock = _Clock()
    procs = FrontDoorProcs(_config(tmp_path, _Exiting), clock)
    procs.start()
    try:
        for crash, delay in enumerate(RESTART_BACKOFF_S):
            wait_for(lambda: procs._slots[0].proc is not None and procs._slots[0].proc.poll() is not None, 30,
                     "the stand-in to exit")  # fmt: skip
            procs.poll()  # notices the exit: due after the backoff
            assert procs.snapshot()[0]["up"] is False and procs.snapshot()[0]["restarts"] == crash
            clock.now += delay - 0.01
            procs.poll()
            assert procs._slots[0].proc is None  # not before its time
            clock.now += 0.02
            procs.poll()
            assert procs.snapshot()[0]["restarts"] == crash + 1
        wait_for(lambda: procs._slots[0].proc is not None and procs._slots[0].proc.poll() is not None, 30,
                 "the last stand-in to exit")  # fmt: skip
        procs.poll()
        row = procs.snapshot()[0]
        assert row["given_up"] is True and row["pid"] is None
        clock.now += 3600
        procs.poll()
        assert procs.snapshot()[0]["pid"] is None
    finally:
        procs.close()
    assert not (tmp_path / "frontdoor").exists()


def test_a_previous_servers_registrations_are_removed_at_start(tmp_path: Path) -> None:
    stale = tmp_path / "frontdoor" / "shm" / "abc"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    procs = FrontDoorProcs(_config(tmp_path, _Exiting, workers=0))
    procs.start()
    try:
        assert not stale.exists() and (tmp_path / "frontdoor").is_dir()
    finally:
        procs.close()


def test_stop_waits_and_nothing_restarts_after_terminate(tmp_path: Path) -> None:
    class _Sleeping(FrontDoorConfig):
        def command(self, index: int) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(60)"]

    clock = _Clock()
    procs = FrontDoorProcs(_config(tmp_path, _Sleeping, workers=2), clock)
    procs.start()
    pids = [row["pid"] for row in procs.snapshot()]
    children = [slot.proc for slot in procs._slots]
    procs.terminate()
    procs.poll()  # after terminate: no restart, whatever exits
    procs.stop(timeout=10)
    # stop waited for each to end, and SIGTERM ended them (not the SIGKILL at the end of the timeout)
    assert [c.returncode if c is not None else None for c in children] == [-signal.SIGTERM] * 2
    assert all(row["pid"] is None and not row["up"] for row in procs.snapshot()) and len(set(pids)) == 2
    procs.close()


@pytest.mark.parametrize(
    ("address", "tls", "insecure", "refused"),
    [("127.0.0.1:1", False, False, False), ("[::1]:1", False, False, False),
     ("localhost:1", False, False, False), ("0.0.0.0:1", False, False, True),
     ("10.0.0.1:1", True, False, False), ("10.0.0.1:1", False, True, False)],
)  # fmt: skip
def test_non_loopback_needs_tls_or_insecure_remote(
    address: str, tls: bool, insecure: bool, refused: bool
) -> None:
    assert (listen_problem(address, tls, insecure) is not None) == refused


class _Doors:
    """What the loop's check calls of ``FrontDoorProcs``, counted."""

    def __init__(self) -> None:
        self.config = _config(Path("unused"))
        self.polls = self.terminates = 0

    def poll(self) -> None:
        self.polls += 1

    def terminate(self) -> None:
        self.terminates += 1


def test_the_loop_looks_at_the_front_doors_every_interval_and_stops_them_at_once() -> None:
    clock, doors, stop = _Clock(), _Doors(), {"count": 0}
    check = _with_frontdoors(lambda: stop["count"], doors, clock)  # type: ignore[arg-type]
    assert check() == 0 and doors.polls == 1  # the first pass looks
    for _ in range(100):  # passes within the interval do not
        clock.now += DOOR_POLL_INTERVAL_S / 200
        assert check() == 0
    assert doors.polls == 1
    clock.now += DOOR_POLL_INTERVAL_S / 2
    check()
    assert doors.polls == 2  # an exit is noticed within the interval
    stop["count"] = 1
    assert check() == 1 and doors.terminates == 1  # a stop request stops them on the next pass, not later
    assert check() == 1 and doors.terminates == 2 and doors.polls == 2


def test_without_front_doors_the_loop_calls_only_the_stop_check(tmp_path: Path) -> None:
    stop = lambda: 0  # noqa: E731
    config = FrontDoorConfig(workers=1, broker_url="ipc:///x/zinfer.sock", runtime_dir=tmp_path)
    assert _with_frontdoors(stop, FrontDoorProcs(config)) is stop


def test_a_door_that_cannot_take_its_cpus_says_so_and_exits_2(tmp_path: Path) -> None:
    """A CPU list the kernel refuses (here one past any machine's CPUs; in service, CPUs gone offline since
    the server checked them): a clear error and exit 2, before the door listens or connects."""
    url = f"ipc://{tmp_path}/none.sock"
    config = FrontDoorConfig(1, url, tmp_path, "127.0.0.1:1", cpus=frozenset({4000}))
    done = subprocess.run(config.command(0), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "event=frontdoor_failed" in done.stderr and "cannot run on CPUs [4000]" in done.stderr
    assert not (tmp_path / "frontdoor" / "0.json").exists()  # never got as far as its status file
