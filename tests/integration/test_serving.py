"""End to end over a real ``zinfer serve``: concurrency, large tensors, metadata and clean shutdown."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for
from tests.gated import address, in_arena, shm_address
from tests.wire_spy import WireSpy
from zinfer.client.client import Client

pytestmark = pytest.mark.integration


def _sum_worker(client: Client, seed: int, n: int, errors: list[str]) -> None:
    rng = np.random.default_rng(seed)
    try:
        for i in range(n):
            a = rng.standard_normal((1, 1)).astype(np.float32)
            b = rng.standard_normal((1, 1)).astype(np.float32)
            out = client.infer("add", {"INPUT_A": a, "INPUT_B": b}).as_numpy("OUTPUT_SUM")
            if out.shape != (1, 1) or out[0, 0] != (a + b)[0, 0]:
                errors.append(f"thread {seed} request {i}: {a} + {b} gave {out}")
                return
    except Exception as exc:  # reported to the main thread
        errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")


def test_64_threads_get_their_own_sums_and_batches_form(bundled_server: ServerProcess) -> None:
    """Half the threads share one client (thread-safe, tiny tensors inline), half have their own (all shm)."""
    errors: list[str] = []
    with ExitStack() as stack:
        shared = stack.enter_context(Client(bundled_server.url, timeout=60))
        url = bundled_server.url  # the own clients send every tensor through shared memory
        own = [stack.enter_context(Client(url, timeout=60, inline_threshold=-1)) for _ in range(32)]
        before = shared.statistics("add")["model_stats"][0]
        threads = [
            threading.Thread(target=_sum_worker, args=(shared if i < 32 else own[i - 32], i, 200, errors))
            for i in range(64)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "threads did not finish"
        assert not errors, errors[:5]
        after = shared.statistics("add")["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == 64 * 200
        sizes = {b["batch_size"]: b["count"] for b in after["batch_stats"]}
        assert max(sizes) > 1, f"no batch larger than 1 formed under load: {sizes}"
        assert all(size <= 16 for size in sizes)
        assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"][
            "count"
        ] == (64 * 200)


def test_64_mib_tensor_round_trips_bit_exact(bundled_server: ServerProcess) -> None:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=(1, 16 << 20), dtype=np.uint32)  # every pattern, NaNs included
    x = bits.view(np.float32)
    assert x.nbytes == 64 << 20
    with Client(bundled_server.url, timeout=60) as client:
        out = client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
        assert out.shape == x.shape
        assert np.array_equal(out.view(np.uint32), bits)
        # and through TCP-style inline frames, without shared memory
    with Client(bundled_server.url, timeout=60, shm=False) as inline:
        out = inline.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
        assert np.array_equal(out.view(np.uint32), bits)


def test_linear_matches_numpy(bundled_server: ServerProcess) -> None:
    w = np.load(MODELS / "linear" / "1" / "W.npy")
    b = np.load(MODELS / "linear" / "1" / "b.npy")
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    with Client(bundled_server.url, timeout=30) as client:
        y = client.infer("linear", {"X": x}).as_numpy("Y")
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_requested_output_subset_and_ids(bundled_server: ServerProcess) -> None:
    a = np.ones((3, 1), np.float32)
    with Client(bundled_server.url, timeout=30) as client:
        res = client.infer("add", {"INPUT_A": a, "INPUT_B": a}, outputs=["OUTPUT_SUM"], request_id="mine")
        assert res.output_names == ["OUTPUT_SUM"]
        assert res.request_id == "mine"
        assert res.model_name == "add" and res.model_version == 1
        np.testing.assert_array_equal(res.as_numpy("OUTPUT_SUM"), 2 * a)


def test_zero_copy_inputs_and_output_views(bundled_server: ServerProcess) -> None:
    """An ``empty()`` array is sent as a descriptor of its own bytes (no copy into another slot) and the
    output is a view of the client's arena where the reply put it, which stays intact while it is
    referenced. What was sent and replied is read off the wire (``WireSpy``), so this holds for a compiled
    client too."""
    with WireSpy(bundled_server.url) as spy, Client(spy.url, timeout=30) as client:
        x = client.empty((2, 1000), np.float32)
        x[:] = np.arange(2000, dtype=np.float32).reshape(2, 1000)
        first = client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0")
        ref = spy.input("INPUT0")
        assert ref.shm is not None and ref.frame is None
        assert shm_address(client, ref.shm.region, ref.shm.offset) == address(x)
        assert ref.shm.nbytes == x.nbytes
        out_ref = spy.output("OUTPUT0")  # the server wrote the output into the client's slot: no frame
        assert out_ref.shm is not None and out_ref.frame is None and out_ref.shm.nbytes == first.nbytes
        assert shm_address(client, out_ref.shm.region, out_ref.shm.offset) == address(first)
        half = x[1:]  # a contiguous slice of it is sent where it lies, too
        out = client.infer("identity", {"INPUT0": half}).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, half)
        ref = spy.input("INPUT0")
        assert ref.shm is not None and shm_address(client, ref.shm.region, ref.shm.offset) == address(half)
        assert in_arena(client, first) and not first.flags.owndata
        snapshot = first.copy()
        # while `first` lives, its slot is not handed to another request
        for k in range(5):
            second = client.infer("identity", {"INPUT0": x * (k + 2)}).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(second, x * (k + 2))
        np.testing.assert_array_equal(first, snapshot)
        assert len(spy.sent) == 7 and len(spy.replied) == 7


def test_health_metadata_config_and_index(bundled_server: ServerProcess) -> None:
    with Client(bundled_server.url, timeout=30) as client:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("add")
        assert not client.is_model_ready("missing")
        meta = client.model_metadata("add")
        assert meta["name"] == "add"
        assert meta["versions"] == ["1"]
        assert meta["inputs"] == [
            {"name": "INPUT_A", "datatype": "FP32", "shape": [-1, 1]},
            {"name": "INPUT_B", "datatype": "FP32", "shape": [-1, 1]},
        ]
        assert meta["outputs"] == [{"name": "OUTPUT_SUM", "datatype": "FP32", "shape": [-1, 1]}]
        cfg = client.model_config("linear")
        assert cfg["max_batch_size"] == 32
        assert cfg["dynamic_batching"]["preferred_batch_size"] == [8, 16, 32]
        index = {(r["name"], r["version"]): r["state"] for r in client.repository_index()}
        for name in ("add", "identity", "linear"):
            assert index[(name, "1")] == "READY"
        assert set(index.values()) == {"READY"}  # every bundled model loads


def test_bundled_repository_path_exists() -> None:
    """The repository ``zinfer serve`` falls back on is the package's own ``configs/models``: this checkout's
    in an editable install, a copy of it in a built one (same models, same configs)."""
    from zinfer.broker.cli import bundled_models

    found = Path(bundled_models())
    assert found.is_dir()

    def configs(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("*/config.pbtxt"))}

    assert configs(found) and configs(found) == configs(MODELS)


def test_the_broker_and_every_worker_tune_their_collector_once_set_up(bundled_server: ServerProcess) -> None:
    """gc_tuning.tune_for_serving runs in the broker (before its loop) and in each worker (once its model is
    loaded), each logging its pid: the frozen start-up heap is what takes full collections off the path."""

    def tuned() -> set[int]:
        return {
            int(part.split("=", 1)[1])
            for line in bundled_server.log().splitlines()
            if "event=gc_tuned" in line
            for part in line.split()
            if part.startswith("pid=")
        }

    with Client(bundled_server.url, timeout=30) as c:
        assert c.is_server_ready()  # every model loaded: each worker is past its load
    workers = {p.pid for p in bundled_server.workers() if "zinfer.workers" in " ".join(p.cmdline())}
    assert len(workers) >= 10, "the bundled repository runs a worker per model instance"
    processes = workers | {bundled_server.proc.pid}
    wait_for(lambda: processes <= tuned(), 10, "the broker and every worker to log event=gc_tuned")
