"""Shared fixtures: a real ``zinfer serve`` process on a private runtime directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from zinfer.client.shm import creator_pid

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "configs" / "models"
# a model parameter for tests that hold requests in the queue with a long max_queue_delay: Triton's timing,
# with no early dispatch when one caller at a time leaves no companion to wait for
TRITON_TIMING = 'parameters { key: "zinfer_early_dispatch" value: { string_value: "false" } }\n'


# started before every other test: the compiled wheel's build takes minutes of one core, which pytest-xdist's
# other test processes use for the rest of the suite in the meantime
FIRST = ("tests/integration/test_wheel_install.py",)
MAX_TEST_PROCESSES = 4  # "-n auto": one per core up to this (each test starts several processes of its own)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown where it is not installed
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many test processes ``-n auto`` starts: one per core this process may run on, at most 4."""
    return max(1, min(MAX_TEST_PROCESSES, len(os.sched_getaffinity(0))))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules of ``FIRST`` first, the rest in their order (every xdist process sorts the same way)."""
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass (then fail the test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def open_fds(pid: int) -> int:
    """How many descriptors process ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints (stripped), or '' when none comes within ``timeout`` seconds."""
    out = proc.stdout
    assert out is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0].strip() if box else ""


def zinfer_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("zinfer")}


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    runtime_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"ipc://{self.runtime_dir / 'zinfer.sock'}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def http_url(self) -> str:
        """Where its /metrics and health endpoints are (from the log)."""
        for line in self.log().splitlines():
            if "event=http_listening" in line:
                return "http://" + line.rsplit("address=", 1)[1].split()[0]
        raise AssertionError("the server logged no HTTP address")

    def workers(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def worker_cmdlines(self) -> list[str]:
        """Command lines of the live (not zombie) worker processes."""
        lines = []
        for p in self.workers():
            try:
                lines.append(" ".join(p.cmdline()))
            except psutil.Error:  # exited, or a zombie the broker has not reaped yet
                pass
        return lines

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        children = self.workers()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        _, alive = psutil.wait_procs(children, timeout=5)
        for p in alive:
            p.kill()
        assert not alive, f"workers still running after the server stopped: {[p.pid for p in alive]}"
        return code


def _metrics_flag(extra: tuple[str, ...]) -> tuple[str, ...]:
    """Servers in tests run side by side: their metrics go on any free port unless a test says otherwise."""
    if any(a.startswith("--metrics") or a == "--no-metrics" for a in extra):
        return ()
    return ("--metrics", "127.0.0.1:0")


def start_server(
    repository: Path = MODELS,
    *extra: str,
    ready_timeout: float = 60.0,
    wait_ready: bool = True,
    runtime_dir: Path | None = None,
) -> ServerProcess:
    """A ``zinfer serve`` on ``runtime_dir/rt`` (default: a fresh temp folder)."""
    runtime_dir = runtime_dir or Path(tempfile.mkdtemp(prefix="zi-"))
    log_path = runtime_dir.with_suffix(f".{time.monotonic_ns()}.log")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zinfer.broker",
                "serve",
                "--model-repository",
                str(repository),
                "--runtime-dir",
                str(runtime_dir / "rt"),
                *_metrics_flag(extra),
                *extra,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = ServerProcess(proc, runtime_dir / "rt", log_path)
    if wait_ready:
        try:
            wait_for(
                lambda: "event=ready" in server.log() or proc.poll() is not None,
                ready_timeout,
                "the server to log readiness",
            )
        except AssertionError:
            server.stop(signal.SIGKILL)
            raise
        if proc.poll() is not None:
            raise AssertionError(f"server exited early with {proc.returncode}:\n{server.log()}")
    return server


@pytest.fixture
def server_factory() -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def factory(*args: object, **kwargs: object) -> ServerProcess:
        s = start_server(*args, **kwargs)  # type: ignore[arg-type]
        started.append(s)
        return s

    yield factory
    stop_all(started)


def stop_all(servers: list[ServerProcess]) -> None:
    """Stop every server and remove its files, even when stopping one of them fails; then raise the first
    failure (the others are chained in its notes)."""
    failures: list[BaseException] = []
    for s in servers:
        try:
            s.stop()
        except BaseException as exc:  # noqa: BLE001 - every server is stopped before anything is raised
            failures.append(exc)
        finally:
            shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
            s.log_path.unlink(missing_ok=True)
    if failures:
        for other in failures[1:]:
            failures[0].add_note(f"also: {type(other).__name__}: {other}")
        raise failures[0]


@pytest.fixture(scope="module")
def bundled_server() -> Iterator[ServerProcess]:
    """One server on the bundled models, shared by a module's tests."""
    before = zinfer_segments()
    s = start_server()
    try:
        yield s
    finally:
        try:
            code = s.stop()
            log = s.log()
        finally:
            shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
            s.log_path.unlink(missing_ok=True)
    assert code == 0, log
    # this server's own segments (ensemble intermediates carry its pid); servers a test killed on purpose may
    # leave theirs for the next start to reap, which test_faults.py's scenario 05 checks
    leaked = {n for n in zinfer_segments() - before if creator_pid(n) == s.proc.pid}
    assert not leaked, f"segments left in /dev/shm: {sorted(leaked)}"
