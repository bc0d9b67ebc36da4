"""Start, serve, stop: signals, locks, broken models, TCP, a worker that dies."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, wait_for, zinfer_segments
from tests.gated import gated_model, pending
from zinfer.client.client import Client
from zinfer.client.errors import ConnectionFailed, NotFound, RequestTimeout, Unavailable

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


def _ab(v: float) -> dict[str, np.ndarray]:
    a = np.full((1, 1), v, np.float32)
    return {"INPUT_A": a, "INPUT_B": a}


def _add(client: Client) -> float:
    return float(client.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE}).as_numpy("OUTPUT_SUM")[0, 0])


def test_sigterm_stops_everything_and_leaves_nothing(server_factory: Callable[..., ServerProcess]) -> None:
    before = zinfer_segments()
    server = server_factory()
    workers = server.workers()
    with Client(server.url, timeout=30) as client:
        ready = [r["name"] for r in client.repository_index() if r["state"] == "READY"]
        ensembles = [n for n in ready if 'platform: "ensemble"' in (MODELS / n / "config.pbtxt").read_text()]
        assert len(workers) == len(ready) - len(ensembles) >= 3  # an ensemble has no worker of its own
        assert _add(client) == 2.0
        client.infer("identity", {"INPUT0": np.ones((1, 1 << 20), np.float32)})
        assert client._arena is not None and client._arena.segments, "the client should own a segment"
        fd = client._arena.segments[0].fd
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")  # a memory file, not in /dev/shm
        broker_memfds = [os.readlink(f"/proc/{server.proc.pid}/fd/{n}") for n in os.listdir(
            f"/proc/{server.proc.pid}/fd")]  # fmt: skip
        assert any(link.startswith("/memfd:zinfer-c") for link in broker_memfds), "the broker holds it"
    assert zinfer_segments() == before
    assert server.stop(signal.SIGTERM) == 0
    assert not [p for p in workers if p.is_running() and p.status() != "zombie"]
    assert not (server.runtime_dir / "zinfer.sock").exists()
    assert not (server.runtime_dir / "workers.sock").exists()
    assert not (server.runtime_dir / "zinfer-regions.sock").exists()
    assert "event=stopped" in server.log()


def test_ctrl_c_to_the_process_group_exits_zero() -> None:
    runtime = Path(tempfile.mkdtemp(prefix="zi-"))
    log_path = runtime / "log"
    try:
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "zinfer.broker",
                    "serve",
                    "--no-metrics",
                    "--runtime-dir",
                    str(runtime / "rt"),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = ServerProcess(proc, runtime / "rt", log_path)
        try:
            wait_for(lambda: "event=ready" in server.log(), 60, "readiness")
            workers = server.workers()
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
            assert proc.wait(20) == 0, server.log()
            wait_for(
                lambda: not any(p.is_running() and p.status() != "zombie" for p in workers), 10, "workers"
            )
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_second_server_on_same_runtime_dir_refuses(server_factory: Callable[..., ServerProcess]) -> None:
    first = server_factory()
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "zinfer.broker",
            "serve",
            "--no-metrics",
            "--runtime-dir",
            str(first.runtime_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert "another zinfer server is running" in second.stderr
    with Client(first.url, timeout=30) as client:  # the first one still owns its socket
        assert _add(client) == 2.0


def test_client_without_server_fails_fast(tmp_path: Path) -> None:
    with Client(f"ipc://{tmp_path}/zinfer.sock", timeout=30) as client:
        with pytest.raises(ConnectionFailed):  # not RequestTimeout after 30 s: no server is noticed
            client.is_server_live()


def test_timeout_when_nobody_answers(tmp_path: Path) -> None:
    import zmq

    dead = zmq.Context.instance().socket(zmq.ROUTER)  # bound, but never replies
    dead.bind(f"ipc://{tmp_path}/zinfer.sock")
    try:
        with Client(f"ipc://{tmp_path}/zinfer.sock", timeout=0.5) as client:
            with pytest.raises(RequestTimeout):
                client.is_server_live()
    finally:
        dead.close(linger=0)


def _repo_with_broken_models(root: Path) -> Path:
    repo = root / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    (repo / "typo" / "1").mkdir(parents=True)
    (repo / "typo" / "config.pbtxt").write_text('name: "typo"\nmax_batch_size: 4\nbogus_field: 1\n')
    (repo / "seq" / "1").mkdir(parents=True)
    (repo / "seq" / "config.pbtxt").write_text(
        'name: "seq"\nbackend: "zinfer"\nmax_batch_size: 4\n'
        'ensemble_scheduling { step [ { model_name: "add" model_version: -1\n'
        '  input_map { key: "INPUT_A" value: "X" } output_map { key: "OUTPUT_SUM" value: "Y" } } ] }\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    (repo / "nokernel" / "1").mkdir(parents=True)
    (repo / "nokernel" / "config.pbtxt").write_text(
        'backend: "zinfer"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "kernel" value: { string_value: "nonexistent" } }\n'
    )
    return repo


def test_broken_models_fail_alone(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = server_factory(_repo_with_broken_models(tmp_path))
    log = server.log()
    assert "bogus_field" in log and "config.pbtxt:3" in log
    with Client(server.url, timeout=30) as client:
        assert _add(client) == 2.0
        assert not client.is_server_ready()  # strict readiness: models that should load have failed
        with pytest.raises(Unavailable, match="bogus_field"):
            client.infer("typo", {"X": ONE})
        with pytest.raises(Unavailable, match='an ensemble needs platform: "ensemble"'):
            client.infer("seq", {"X": ONE})
        wait_for(lambda: "kernel" in str(client.repository_index()), 30, "the kernel error")
        with pytest.raises(Unavailable, match="parameter 'kernel'"):
            client.infer("nokernel", {"X": ONE})
        with pytest.raises(NotFound):
            client.infer("absent", {"X": ONE})
        states = {r["name"]: r["state"] for r in client.repository_index()}
        assert states == {
            "add": "READY",
            "typo": "UNAVAILABLE",
            "seq": "UNAVAILABLE",
            "nokernel": "UNAVAILABLE",
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_clients_send_tensors_inline(server_factory: Callable[..., ServerProcess]) -> None:
    port = _free_port()
    server = server_factory(MODELS, "--tcp", f"127.0.0.1:{port}")
    with Client(f"tcp://127.0.0.1:{port}", timeout=30) as client:
        assert _add(client) == 2.0
        x = np.random.default_rng(3).standard_normal((2, 3000)).astype(np.float32)
        np.testing.assert_array_equal(client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)
    assert server.proc.poll() is None


def test_killed_worker_is_restarted(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory()
    with Client(server.url, timeout=30) as client:
        assert _add(client) == 2.0
        victim = next(p for p in server.workers() if "add" in p.cmdline())
        victim.kill()
        wait_for(lambda: "event=worker_exited model=add" in server.log(), 10, "the broker to notice")
        wait_for(lambda: client.is_model_ready("add"), 30, "the instance to come back", interval=0.1)
        assert _add(client) == 2.0
        assert victim.pid not in [p.pid for p in server.workers()]


def _identity(server: ServerProcess, model: str) -> bytes:
    """The ``--identity`` of the live worker of ``model`` (its command line)."""
    for line in server.worker_cmdlines():
        args = line.split()
        if "--identity" in args and args[args.index("--identity") + 1].startswith(f"{model}/"):
            return args[args.index("--identity") + 1].encode()
    raise AssertionError(f"no live worker for {model}")


def test_a_restarted_worker_has_a_new_identity_and_stale_results_are_discarded(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Row 25: the killed worker's replacement has another identity. Results sent under the old identity
    (for every batch id a broker could have used) while the new incarnation runs a batch are dropped
    (``unknown_worker``): the waiting request gets its own answer, not the forged one."""
    import zmq

    from zinfer.client import protocol
    from zinfer.client.paths import worker_endpoint
    from zinfer.client.protocol import Command, TensorRef
    from zinfer.client.worker_protocol import RequestResult, WorkerResult, result_to_wire

    gate = gated_model(tmp_path, "g")
    server = server_factory(tmp_path)
    gate.release_all()
    with Client(server.url, timeout=30) as client:
        assert client.infer("g", _ab(1)).as_numpy("OUTPUT_SUM")[0, 0] == 2.0  # batch ids are in use
        old = _identity(server, "g")
        os.kill(int(next(p.pid for p in server.workers() if old.decode() in " ".join(p.cmdline()))), 9)
        wait_for(lambda: "event=worker_exited model=g" in server.log(), 10, "the broker to notice")
        wait_for(lambda: client.is_model_ready("g"), 30, "the replacement", interval=0.1)
        new = _identity(server, "g")
        assert new != old
        gate.reset()
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(client.infer("g", _ab(5)).as_numpy("OUTPUT_SUM")))
        t.start()
        gate.wait_started(5)  # a batch in flight on the new incarnation
        forged = np.full((1, 1), 999, np.float32)
        with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as ghost:
            ghost.setsockopt(zmq.IDENTITY, old)
            ghost.setsockopt(zmq.LINGER, 0)
            ghost.connect(worker_endpoint(server.runtime_dir))
            out = (TensorRef("OUTPUT_SUM", "FP32", (1, 1), frame=0),)
            for batch in range(64):
                answers = tuple(RequestResult(i, outputs=out) for i in range(64))
                header = result_to_wire(WorkerResult(batch, answers))
                ghost.send_multipart(protocol.encode(Command.W_RESULT, header, [forged]))
            wait_for(lambda: "event=unknown_worker" in server.log(), 10, "the old identity's results dropped")
        gate.release_all()
        t.join(30)
        assert len(result) == 1 and result[0][0, 0] == 10.0  # type: ignore[index]
        assert client.infer("g", _ab(2)).as_numpy("OUTPUT_SUM")[0, 0] == 4.0


def test_unusable_runtime_dir_fails_with_a_clear_error(tmp_path: Path) -> None:
    too_long = tmp_path / ("d" * 120)
    done = subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics",
         "--runtime-dir", str(too_long)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2  # a configuration error
    assert "event=bad_config" in done.stderr and "longer than" in done.stderr


def test_missing_repository_fails_with_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics",
         "--model-repository", str(tmp_path / "nope"),
         "--runtime-dir", str(tmp_path / "rt")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "event=bad_repository" in done.stderr


def test_timed_out_request_keeps_its_slots_until_the_late_reply(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "slow")
    cfg = (repo / "slow" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "slow"').replace(
        "max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 400000"
    )
    (repo / "slow" / "config.pbtxt").write_text(cfg + TRITON_TIMING)
    server = server_factory(repo)
    with Client(server.url, timeout=30, inline_threshold=-1) as client:
        client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE})  # metadata fetched, arena made
        with pytest.raises(RequestTimeout):
            client.infer("slow", {"INPUT_A": ONE, "INPUT_B": ONE}, client_timeout=0.05)
        assert len(client._orphans) == 1  # the server may still write into them
        # the next call reads the late reply on its way (a sync client reads only while a call waits)
        out = client.infer("slow", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}).as_numpy("OUTPUT_SUM")
        assert out[0, 0] == 3.0
        assert not client._orphans


def test_sigterm_drains_queued_requests_and_refuses_new_ones(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Scenario 23: SIGTERM with one batch running (held) and one request queued behind it: intake stops
    (``Unavailable``), both finish once the batch is let go, then the server exits 0."""
    gate = gated_model(tmp_path, "g")
    server = server_factory(tmp_path)
    results: dict[int, object] = {}
    try:
        with Client(server.url, timeout=30) as first, Client(server.url, timeout=30) as second:

            def call(c: Client, tag: int) -> None:
                try:
                    results[tag] = float(c.infer("g", _ab(tag)).as_numpy("OUTPUT_SUM")[0, 0])
                except Exception as exc:
                    results[tag] = exc

            running = threading.Thread(target=call, args=(first, 1))
            running.start()
            gate.wait_started(1)
            queued = threading.Thread(target=call, args=(second, 2))
            queued.start()
            wait_for(lambda: pending(server, "g") == 1, 10, "the second request to wait in the queue")
            server.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: "event=draining" in server.log(), 10, "the server to start draining")
            with Client(server.url, timeout=10) as late:
                with pytest.raises(Unavailable, match="shutting down"):
                    late.infer("g", _ab(3))
            assert server.proc.poll() is None and not results  # draining: nothing answered yet
            gate.release_all()
            running.join(30)
            queued.join(30)
        assert results == {1: 2.0, 2: 4.0}
        assert gate.order() == [1, 2]
        assert server.proc.wait(30) == 0, server.log()
    finally:
        gate.release_all()


def test_client_survives_a_server_restart(server_factory: Callable[..., ServerProcess]) -> None:
    """Scenario 4: a clear error while the server is gone, then the same client works again (its
    shared-memory regions are registered anew with the new server)."""
    first = server_factory()
    runtime = first.runtime_dir.parent
    with Client(first.url, timeout=10, inline_threshold=-1) as client:
        assert _add(client) == 2.0
        assert first.stop() == 0
        with pytest.raises(ConnectionFailed):  # not RequestTimeout after 10 s: the loss is noticed
            _add(client)
        server_factory(MODELS, runtime_dir=runtime)
        assert _add(client) == 2.0


def test_dead_clients_regions_are_reaped(server_factory: Callable[..., ServerProcess]) -> None:
    """Scenario 7: a client exits without closing: nothing is left in /dev/shm (its segments are memory
    files, gone with their last descriptor), and the broker, finding the connection gone, drops its regions
    and closes its descriptors, which frees the memory."""
    server = server_factory()
    code = (
        "import numpy as np, os, sys\n"
        "from zinfer.client import Client\n"
        f"c = Client({server.url!r}, timeout=30, inline_threshold=-1)\n"
        "c.infer('add', {'INPUT_A': np.ones((1, 1), np.float32), 'INPUT_B': np.ones((1, 1), np.float32)})\n"
        "os._exit(0)  # no close()\n"
    )
    broker_fds = lambda: len(os.listdir(f"/proc/{server.proc.pid}/fd"))  # noqa: E731
    before, shm_before = broker_fds(), zinfer_segments()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert zinfer_segments() == shm_before
    wait_for(lambda: "event=regions_reaped reason=connection_gone" in server.log(), 15,
             "the server to drop the dead client's regions")  # fmt: skip
    # the log line comes before the descriptors close, and the dead connection's own socket closes on
    # ZeroMQ's I/O thread: wait for both, against a deadline
    wait_for(lambda: broker_fds() <= before, 15, "the broker to close the dead client's descriptors")


def test_cpu_affinity_and_region_limit_from_a_config_file(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 9, placement: a worker is pinned to the CPUs the config gives its model's instance."""
    cfg = tmp_path / "zinfer.toml"
    cfg.write_text('max_region_bytes = 1048576\n[cpu_affinity]\nadd = ["0"]\n"*" = ["1"]\n')
    server = server_factory(MODELS, "--config", str(cfg))
    import psutil

    pins = {}
    for p in server.workers():
        cmd = " ".join(p.cmdline())
        pins[cmd.split("--model ")[1].split()[0]] = psutil.Process(p.pid).cpu_affinity()
        # every thread, not just the main one (importing the worker starts numpy's before it pins itself)
        masks = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{p.pid}/task")}
        assert masks == {tuple(psutil.Process(p.pid).cpu_affinity())}
    assert pins["add"] == [0]
    assert pins["identity"] == [1]
    with Client(server.url, timeout=30, arena_bytes=4 << 20) as client:
        with pytest.raises(Exception, match="byte limit"):
            client.infer("identity", {"INPUT0": np.ones((1, 1 << 20), np.float32)})
