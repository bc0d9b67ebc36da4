"""Row 27 of docs/reliability.md, bounded: load while the model's worker is killed and clients die.

``bench/bench_soak.py`` runs the same mix for minutes and is what shows the broker's RSS and descriptors stay
flat over a long run; this test runs it for a few seconds and checks what a short run can: no request lost,
the server still serving, every region a dead client left released, and no runaway growth.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.conftest import MODELS, ServerProcess, open_fds, read_line, wait_for, zinfer_segments
from zinfer.client import Client
from zinfer.client.errors import RequestTimeout, ServerError, ZinferError
from zinfer.client.shm import creator_pid

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOAD_S = 7.0  # the load runs this long at most...
CALLS_PER_LOADER = 2500  # ...and each loader sends at most this many requests
LOADERS = 3
DYING_CLIENTS = 4
CALL_TIMEOUT_S = 10.0
RSS_BOUND = 64 << 20  # flatness over a long run is the benchmark's job; this only catches runaway growth

# registers its arena (inline_threshold=-1: every tensor through shared memory), says so, keeps sending until
# the test SIGKILLs it: no close(), so the server must find the connection gone and release its regions
DYING_CLIENT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from zinfer.client import Client
    c = Client(sys.argv[1], timeout=10, inline_threshold=-1)
    one = np.ones((1, 1), np.float32)
    deadline = time.monotonic() + 15  # the soak kills workers: a first call may meet one restarting
    while True:
        try:
            c.infer("add", {"INPUT_A": one, "INPUT_B": one})
            c.infer("identity", {"INPUT0": np.ones((1, 4096), np.float32)})
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    print("registered", flush=True)
    deadline = time.monotonic() + 60  # a bound, should the test die first
    while time.monotonic() < deadline:
        try:
            c.infer("add", {"INPUT_A": one, "INPUT_B": one})
        except Exception:
            time.sleep(0.01)
    """
)


class Tally:
    """Every call's outcome: ``ok``, ``wrong`` (an answer, not the right one), ``clear`` (a server error
    such as Unavailable), ``lost`` (RequestTimeout: no answer at all), ``other`` (anything else), and the
    slowest call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(("ok", "wrong", "clear", "lost", "other"), 0)
        self.errors: dict[str, int] = {}
        self.slowest = 0.0

    def add(self, key: str, took: float, error: BaseException | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            self.slowest = max(self.slowest, took)
            if error is not None:
                name = f"{type(error).__name__}: {str(error)[:80]}"
                self.errors[name] = self.errors.get(name, 0) + 1


def _loader(url: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sent = 0
    while not stop.is_set() and sent < CALLS_PER_LOADER:
        # clients come and go (closed properly) through the run, half of them through shared memory
        with Client(url, timeout=CALL_TIMEOUT_S, inline_threshold=int(rng.choice([-1, 4096]))) as c:
            for _ in range(int(rng.integers(40, 120))):
                if stop.is_set() or sent >= CALLS_PER_LOADER:
                    break
                sent += 1
                add = rng.random() < 0.8
                a = rng.standard_normal((1, 1 if add else int(rng.integers(1, 20000)))).astype(np.float32)
                start = time.monotonic()
                try:
                    if add:
                        out = c.infer("add", {"INPUT_A": a, "INPUT_B": a}).as_numpy("OUTPUT_SUM")
                    else:
                        out = c.infer("identity", {"INPUT0": a}).as_numpy("OUTPUT0")
                except RequestTimeout as exc:
                    tally.add("lost", time.monotonic() - start, exc)
                except ServerError as exc:
                    tally.add("clear", time.monotonic() - start, exc)
                    stop.wait(0.02)  # as a real client backs off: refusals while add restarts come at once
                except ZinferError as exc:  # ConnectionFailed and the like: the server never went away
                    tally.add("other", time.monotonic() - start, exc)
                else:
                    right = np.array_equal(out, a + a if add else a)
                    tally.add("ok" if right else "wrong", time.monotonic() - start)


def _dying_clients(
    url: str, broker: int, stop: threading.Event, procs: list[subprocess.Popen[str]], held: list[int]
) -> None:
    """Clients, one after another, that register regions and are SIGKILLed while sending; ``held`` gets the
    number of memory files the broker holds while each is alive and registered."""
    rng = random.Random(len(procs))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(DYING_CLIENTS // 2):
        if stop.is_set():
            return
        proc = subprocess.Popen([sys.executable, "-c", DYING_CLIENT, url], stdout=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, cwd=ROOT, env=env)  # fmt: skip
        procs.append(proc)
        if read_line(proc, 20.0) == "registered":
            held.append(_memory_fds(broker))
            stop.wait(rng.uniform(0.1, 0.4))  # some requests in flight when it dies
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def _add_worker(server: ServerProcess) -> psutil.Process | None:
    for p in server.workers():
        try:
            if "--model add" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except psutil.Error:
            pass
    return None


def _kill_and_wait_restart(server: ServerProcess, probe: Client) -> int:
    victim = _add_worker(server)
    assert victim is not None, "no live worker for add"
    victim.send_signal(signal.SIGKILL)

    def restarted() -> bool:
        worker = _add_worker(server)
        return worker is not None and worker.pid != victim.pid and probe.is_model_ready("add")

    wait_for(restarted, 30.0, "the supervisor to restart the killed add worker", interval=0.05)
    return victim.pid


def _memory_fds(pid: int) -> int:
    """The broker's descriptors of memory files and /dev/shm files: one per region it holds."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        n += link.startswith(("/memfd:", "/dev/shm/"))
    return n


def _server_segments(pid: int) -> set[str]:
    return {n for n in zinfer_segments() if creator_pid(n) == pid}


def test_soak_with_workers_killed_and_clients_dying_loses_nothing_and_leaks_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Row 27, bounded (bench/bench_soak.py is the long run): a few client threads send add and identity for
    about 7 s while the add worker is SIGKILLed twice (each time waiting for its restart) and clients that
    registered shared-memory regions are SIGKILLed mid-load. Every call gets the right answer or a clear
    server error (none lost to its timeout, none slower than it), the server still serves, the broker's
    descriptors (memory files among them) and the server's /dev/shm segments come back to the baseline once
    the dead clients are reaped, and its RSS grew by less than 64 MiB."""
    repo = tmp_path / "models"
    for model in ("add", "identity"):
        shutil.copytree(MODELS / model, repo / model)
    server = server_factory(repo)
    broker = psutil.Process(server.proc.pid)
    one = np.ones((1, 1), np.float32)
    with Client(server.url, timeout=CALL_TIMEOUT_S, inline_threshold=-1) as warm:  # warm both paths up
        assert warm.infer("add", {"INPUT_A": one, "INPUT_B": one}).as_numpy("OUTPUT_SUM")[0, 0] == 2.0
        warm.infer("identity", {"INPUT0": np.ones((1, 20000), np.float32)})
    with Client(server.url, timeout=CALL_TIMEOUT_S) as probe:  # inline only: holds no region
        probe.is_server_ready()
        fds_base, memory_base = open_fds(broker.pid), _memory_fds(broker.pid)
        segments_base, rss_base = _server_segments(broker.pid), broker.memory_info().rss

        tally, stop = Tally(), threading.Event()
        dying: list[subprocess.Popen[str]] = []
        held: list[int] = []  # the broker's memory files while a dying client was alive
        threads = [threading.Thread(target=_loader, args=(server.url, stop, tally, i), daemon=True)
                   for i in range(LOADERS)]  # fmt: skip
        threads += [threading.Thread(target=_dying_clients, args=(server.url, broker.pid, stop, dying, held),
                                     daemon=True) for _ in range(2)]  # fmt: skip
        killed: list[int] = []
        try:
            for t in threads:
                t.start()
            start = time.monotonic()
            for at in (1.5, 4.0):  # the add worker, twice, under load
                stop.wait(max(0.0, start + at - time.monotonic()))
                killed.append(_kill_and_wait_restart(server, probe))
            stop.wait(max(0.0, start + LOAD_S - time.monotonic()))
        finally:
            stop.set()
            for t in threads:  # a call that hung past its timeout would keep its thread here
                t.join(CALL_TIMEOUT_S + 15.0)
            for proc in dying:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"threads still in a call long past its timeout: {hung}"

        counts = tally.counts
        assert len(killed) == 2
        assert counts["lost"] == 0 and counts["wrong"] == 0 and counts["other"] == 0, (counts, tally.errors)
        assert tally.slowest < CALL_TIMEOUT_S, f"a call took {tally.slowest:.1f} s"
        assert counts["ok"] > 100, counts  # the load was real
        # the release checked below is not vacuous: dying clients held regions in the broker when killed
        assert len(held) >= 2 and min(held) > memory_base, f"dying clients' regions held: {held}"

        # still serving, both models, inline
        assert probe.infer("add", {"INPUT_A": one, "INPUT_B": one}).as_numpy("OUTPUT_SUM")[0, 0] == 2.0
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        np.testing.assert_array_equal(probe.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)

        # every connection is gone but the probe's: the dead clients' regions are released once reaped
        def back_to_baseline() -> bool:
            return _memory_fds(broker.pid) <= memory_base and open_fds(broker.pid) <= fds_base + 2

        try:
            wait_for(back_to_baseline, 15.0, "the broker to release the dead clients' regions", interval=0.1)
        except AssertionError as exc:
            exc.add_note(f"descriptors {open_fds(broker.pid)} (baseline {fds_base}), memory files "
                         f"{_memory_fds(broker.pid)} (baseline {memory_base})")  # fmt: skip
            raise
        assert _server_segments(broker.pid) <= segments_base
        assert server.log().count("event=regions_reaped reason=connection_gone") >= len(held)
        grown = broker.memory_info().rss - rss_base
        assert grown < RSS_BOUND, f"broker RSS grew by {grown >> 20} MiB during a short soak"
