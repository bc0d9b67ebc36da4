"""GPU workers on a real device: the device layer in-process, then linear/mlp (FP32, FP16) and a native
Python model through a real server on KIND_GPU instances, against NumPy references; and the look-ahead
(``gpu_prefetch``): the next batch's copies on the copy stream while the current batch computes, bit-exact
with running the same batches one at a time.

Skipped (by tests/gpu/conftest.py) unless CuPy sees a CUDA device.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProcess
from zinfer.broker.devices import gpu_ids, probe_gpus
from zinfer.client import Client
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchOutcome, BatchRequest, run_batch
from zinfer.workers.batch_io import request_arrays
from zinfer.workers.device import open_device
from zinfer.workers.loader import load_model
from zinfer.workers.regions import RegionCache

RNG = np.random.default_rng(11)
K, H, N = 256, 512, 128
W0 = (RNG.standard_normal((K, H)) / np.sqrt(K)).astype(np.float32)
B0 = (RNG.standard_normal(H) * 0.1).astype(np.float32)
W1 = (RNG.standard_normal((H, N)) / np.sqrt(H)).astype(np.float32)
B1 = (RNG.standard_normal(N) * 0.1).astype(np.float32)


def _reference(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray, bool]]) -> np.ndarray:
    h = x.astype(np.float64)
    for w, b, relu in layers:
        h = h @ w.astype(np.float64) + b
        if relu:
            h = np.maximum(h, 0)
    return h


def _dense_config(name: str, kernel: str, dtype: str, n_out: int, kind: str = "KIND_GPU") -> str:
    return (
        f'name: "{name}"\nbackend: "zinfer"\nmax_batch_size: 64\n'
        f'input [ {{ name: "X" data_type: {dtype} dims: [ {K} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: {dtype} dims: [ {n_out} ] }} ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
        f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"
        f'parameters {{ key: "kernel" value: {{ string_value: "{kernel}" }} }}\n'
    )


def test_probe_finds_the_gpu() -> None:
    probe = probe_gpus()
    assert probe.ids and probe.reason == "", probe
    assert gpu_ids() == list(probe.ids)


def test_device_layer_copies_through_page_locked_regions(tmp_path: Path) -> None:
    device = open_device("gpu:0")
    np.savez(tmp_path / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    config = parse_model_config(_dense_config("m", "mlp", "TYPE_FP32", N), source="t", model_name="m")
    model = load_model(config, tmp_path, device)
    seg, regions = Segment.create(8 << 20), RegionCache(device)
    try:
        x = RNG.standard_normal((24, K)).astype(np.float32)
        np.frombuffer(seg.buf, np.float32, count=x.size).reshape(x.shape)[:] = x
        row = K * 4
        out_base = 4 << 20
        reqs = [
            BatchRequest(
                i,
                (TensorRef("X", "FP32", (8, K), shm=ShmRef(seg.name, i * 8 * row, 8 * row)),),
                (OutputRequest("Y", ShmRef(seg.name, out_base + i * 8 * N * 4, 8 * N * 4)),),
            )
            for i in range(3)
        ]
        out = run_batch(model, Signature.of(config), reqs, [], regions, device)
        assert [r["status"] for r in out.results] == [0, 0, 0], out.results
        assert seg.name in device._pinned  # type: ignore[attr-defined]
        got = np.frombuffer(seg.buf, np.float32, count=24 * N, offset=out_base).reshape(24, N).copy()
        expected = _reference(x, [(W0, B0, True), (W1, B1, False)])
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
    finally:
        regions.close()
        seg.close()
    assert not device._pinned  # type: ignore[attr-defined]
    device.close()


@pytest.fixture
def gpu_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name, kernel, dtype in (
        ("lin32", "linear", "TYPE_FP32"),
        ("lin16", "linear", "TYPE_FP16"),
        ("mlp32", "mlp", "TYPE_FP32"),
        ("mlp16", "mlp", "TYPE_FP16"),
    ):
        (repo / name / "1").mkdir(parents=True)
        n_out = H if kernel == "linear" else N
        (repo / name / "config.pbtxt").write_text(_dense_config(name, kernel, dtype, n_out))
        if kernel == "linear":
            np.save(repo / name / "1" / "W.npy", W0)
            np.save(repo / name / "1" / "b.npy", B0)
        else:
            np.savez(repo / name / "1" / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    native = repo / "on_gpu"
    (native / "1").mkdir(parents=True)
    (native / "config.pbtxt").write_text(
        'name: "on_gpu"\nbackend: "python"\nmax_batch_size: 16\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },\n'
        '         { name: "IS_CUPY" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
    )
    (native / "1" / "model.py").write_text(
        textwrap.dedent(
            """
            import cupy

            class Model:
                def initialize(self, config):
                    assert config["device"] == "gpu:0" and config["device_kind"] == "GPU"

                def execute(self, inputs):
                    x = inputs["X"]
                    flag = cupy.full((x.shape[0], 1), int(isinstance(x, cupy.ndarray)), dtype=cupy.int32)
                    return {"Y": x * 2, "IS_CUPY": flag}
            """
        )
    )
    return repo


def test_dense_kernels_and_python_model_on_gpu_workers(
    server_factory: Callable[..., ServerProcess], gpu_repo: Path
) -> None:
    server = server_factory(gpu_repo)
    cmdlines = server.worker_cmdlines()
    assert sum("--device gpu:" in c for c in cmdlines) == 4 * len(gpu_ids()) + 1, cmdlines
    x = RNG.standard_normal((32, K)).astype(np.float32)
    lin = _reference(x, [(W0, B0, False)])
    mlp = _reference(x, [(W0, B0, True), (W1, B1, False)])
    with Client(server.url, timeout=60, arena_bytes=64 << 20) as client:
        for model, expected in (("lin32", lin), ("mlp32", mlp)):
            y = client.infer(model, {"X": x}).as_numpy("Y")
            assert y.dtype == np.float32
            np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-3)
        for model, expected in (("lin16", lin), ("mlp16", mlp)):
            y = client.infer(model, {"X": x.astype(np.float16)}).as_numpy("Y")
            assert y.dtype == np.float16
            np.testing.assert_allclose(y.astype(np.float64), expected, rtol=3e-2, atol=3e-2)

        def one(i: int) -> Any:
            return client.infer("mlp32", {"X": x[i : i + 1]}).as_numpy("Y")

        with ThreadPoolExecutor(16) as pool:  # many requests, gathered into device batches
            rows = list(pool.map(one, range(32)))
        np.testing.assert_allclose(np.concatenate(rows), mlp, rtol=1e-3, atol=1e-3)

        small = np.arange(8, dtype=np.float32).reshape(2, 4)
        result = client.infer("on_gpu", {"X": small})
        np.testing.assert_array_equal(result.as_numpy("Y"), small * 2)
        assert result.as_numpy("IS_CUPY").tolist() == [[1], [1]]


def _mlp_batches(seg: Segment, count: int) -> list[list[BatchRequest]]:
    """``count`` batches of 1 to 4 requests of 1 to 16 rows each, inputs and outputs in ``seg``."""
    row_in, row_out, out_base = K * 4, N * 4, seg.size // 2
    sizes = np.random.default_rng(5).integers(1, 17, (count, 4))
    batches, row = [], 0
    for k in range(count):
        reqs = []
        for j in range(1 + k % 4):
            n = int(sizes[k, j])
            x = ShmRef(seg.name, row * row_in, n * row_in)
            y = ShmRef(seg.name, out_base + row * row_out, n * row_out)
            reqs.append(
                BatchRequest(100 * k + j, (TensorRef("X", "FP32", (n, K), shm=x),), (OutputRequest("Y", y),))
            )
            row += n
        batches.append(reqs)
    return batches


def test_looking_ahead_is_bit_exact_over_many_back_to_back_batches(tmp_path: Path) -> None:
    """The same 64 batches run one at a time, then each staged on the copy stream while the one before
    computes (as a worker with gpu_prefetch does): every output byte is the same, and all are right."""
    device = open_device("gpu:0")
    np.savez(tmp_path / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    config = parse_model_config(_dense_config("m", "mlp", "TYPE_FP32", N), source="t", model_name="m")
    model, sig = load_model(config, tmp_path, device), Signature.of(config)
    seg = Segment.create(32 << 20)
    regions = RegionCache(device)
    try:
        batches = _mlp_batches(seg, 64)
        rows = sum(r.inputs[0].shape[0] for b in batches for r in b)
        out_base = seg.size // 2
        x = RNG.standard_normal((rows, K)).astype(np.float32)
        np.frombuffer(seg.buf, np.float32, count=x.size).reshape(x.shape)[:] = x

        def run_all(look_ahead: bool) -> bytes:
            np.frombuffer(seg.buf, np.float32, count=rows * N, offset=out_base)[:] = np.nan
            running, staged = [0], [-1]

            def stage_next(done: Any) -> None:
                k = running[0] + 1
                if k < len(batches) and staged[0] != k:
                    per_name: dict[str, list[Any]] = {}
                    for req in batches[k]:
                        for name, arr in request_arrays(req, [], regions).items():
                            per_name.setdefault(name, []).append(arr)
                    device.stage(k, list(per_name.values()))  # type: ignore[attr-defined]
                    staged[0] = k

            device.on_wait = stage_next if look_ahead else None
            for k, reqs in enumerate(batches):
                running[0] = k
                device.take_staged(k)  # type: ignore[attr-defined]
                out: BatchOutcome = run_batch(model, sig, reqs, [], regions, device)
                assert all(r["status"] == 0 for r in out.results), out.results
            device.on_wait = None
            return bytes(seg.buf[out_base : out_base + rows * N * 4])

        alone = run_all(look_ahead=False)
        assert device.staged_hits == 0  # type: ignore[attr-defined]
        ahead = run_all(look_ahead=True)
        assert device.staged_hits == len(batches) - 1  # type: ignore[attr-defined]
        assert alone == ahead
        got = np.frombuffer(ahead, np.float32).reshape(rows, N)
        np.testing.assert_allclose(
            got, _reference(x, [(W0, B0, True), (W1, B1, False)]), rtol=1e-3, atol=1e-3
        )
    finally:
        regions.close()
        seg.close()
    device.close()


def test_a_server_instance_with_gpu_prefetch_serves_concurrent_clients_exactly(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Through a real server: one KIND_GPU instance with gpu_prefetch (two batches handed to it at a
    time), many concurrent clients; integer adds are exact whatever the batches were."""
    repo = tmp_path / "repo"
    for name in ("add_ahead", "mlp_ahead"):
        (repo / name / "1").mkdir(parents=True)
    (repo / "add_ahead" / "config.pbtxt").write_text(
        'name: "add_ahead"\nbackend: "zinfer"\nmax_batch_size: 64\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 1024 ] },\n'
        '        { name: "B" data_type: TYPE_INT32 dims: [ 1024 ] } ]\n'
        'output [ { name: "S" data_type: TYPE_INT32 dims: [ 1024 ] },\n'
        '         { name: "D" data_type: TYPE_INT32 dims: [ 1024 ] } ]\n'
        "dynamic_batching { }\n"
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "add" } }, '
        '{ key: "gpu_prefetch" value: { string_value: "true" } } ]\n'
    )
    (repo / "mlp_ahead" / "config.pbtxt").write_text(
        _dense_config("mlp_ahead", "mlp", "TYPE_FP32", N).replace("count: 1 }", "count: 1 gpus: [ 0 ] }")
        + 'parameters { key: "gpu_prefetch" value: { string_value: "true" } }\n'
    )
    np.savez(repo / "mlp_ahead" / "1" / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    server = server_factory(repo)
    rng = np.random.default_rng(9)
    a = rng.integers(-(1 << 20), 1 << 20, (256, 1024), dtype=np.int32)
    b = rng.integers(-(1 << 20), 1 << 20, (256, 1024), dtype=np.int32)
    x = rng.standard_normal((256, K)).astype(np.float32)
    with Client(server.url, timeout=60, arena_bytes=256 << 20) as client:

        def one(i: int) -> tuple[Any, Any, Any]:
            rows = slice(i, i + 1 + i % 3)
            r = client.infer("add_ahead", {"A": a[rows], "B": b[rows]})
            y = client.infer("mlp_ahead", {"X": x[rows]}).as_numpy("Y")
            return r.as_numpy("S"), r.as_numpy("D"), y

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(one, range(240)))
    for i, (s, d, y) in enumerate(got):
        rows = slice(i, i + 1 + i % 3)
        assert s.tobytes() == (a[rows] + b[rows]).tobytes() and d.tobytes() == (a[rows] - b[rows]).tobytes()
        np.testing.assert_allclose(
            y, _reference(x[rows], [(W0, B0, True), (W1, B1, False)]), rtol=1e-3, atol=1e-3
        )
    log = server.log()
    assert "event=gpu_prefetch model=add_ahead" in log and "event=gpu_prefetch model=mlp_ahead" in log, log


# ------------------------------------------------------------------ issue 19: big GEMMs, the compute stream

BIG = 4096  # M = K = N: the GEMM takes milliseconds, far longer than Python's overhead, so a copy or a
# reply not ordered after it would read or send unfinished results


def _big_gemm_config(name: str, prefetch: bool) -> str:
    return (
        f'name: "{name}"\nbackend: "zinfer"\nmax_batch_size: {BIG}\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {BIG} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {BIG} ] }} ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "linear" } },\n'
        f'             {{ key: "gpu_prefetch" value: {{ string_value: "{str(prefetch).lower()}" }} }} ]\n'
    )


def test_a_4096_cubed_gemm_through_zinfer_matches_cupy_matmul_alone(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Three different 4096x4096 inputs, back to back, through a worker's batch runner with each next
    batch staged on the copy stream while the current one computes, then through a real server with
    gpu_prefetch: every output equals ``cupy.matmul`` of the same operands run alone, and the kernels
    stayed on the compute stream (no stray stream, the compute stream current after each batch)."""
    import cupy

    rng = np.random.default_rng(19)
    w = (rng.standard_normal((BIG, BIG)) / np.sqrt(BIG)).astype(np.float32)
    xs = [rng.standard_normal((BIG, BIG)).astype(np.float32) for _ in range(3)]
    wd = cupy.asarray(w)
    alone = [cupy.matmul(cupy.asarray(x), wd).get() for x in xs]
    del wd
    cupy.get_default_memory_pool().free_all_blocks()

    np.save(tmp_path / "W.npy", w)
    device = open_device("gpu:0")
    config = parse_model_config(_big_gemm_config("g", False), source="t", model_name="g")
    model, sig = load_model(config, tmp_path, device), Signature.of(config)
    nbytes = BIG * BIG * 4
    seg, regions = Segment.create(4 * nbytes), RegionCache(device)
    try:
        for k, x in enumerate(xs):
            np.frombuffer(seg.buf, np.float32, count=x.size, offset=k * nbytes)[:] = x.reshape(-1)
        reqs = [
            [BatchRequest(k, (TensorRef("X", "FP32", (BIG, BIG), shm=ShmRef(seg.name, k * nbytes, nbytes)),),
                          (OutputRequest("Y", ShmRef(seg.name, 3 * nbytes, nbytes)),))]
            for k in range(3)
        ]  # fmt: skip
        running = [0]

        def stage_next(wait: Any) -> None:
            k = running[0] + 1
            if k < len(reqs):
                device.stage(k, [[request_arrays(reqs[k][0], [], regions)["X"]]])  # type: ignore[attr-defined]

        device.on_wait = stage_next
        for k in range(3):
            running[0] = k
            device.take_staged(k)  # type: ignore[attr-defined]
            out = run_batch(model, sig, reqs[k], [], regions, device)
            assert out.results[0]["status"] == 0, out.results
            assert cupy.cuda.get_current_stream() == device.stream  # type: ignore[attr-defined]
            got = np.frombuffer(seg.buf, np.float32, count=BIG * BIG, offset=3 * nbytes).reshape(BIG, BIG)
            np.testing.assert_allclose(got, alone[k], rtol=1e-4, atol=1e-4)
        assert device.staged_hits == 2 and device.stray_streams == 0  # type: ignore[attr-defined]
    finally:
        device.on_wait = None
        regions.close()
        seg.close()
        device.close()

    repo = tmp_path / "repo"
    (repo / "big" / "1").mkdir(parents=True)
    (repo / "big" / "config.pbtxt").write_text(_big_gemm_config("big", True))
    np.save(repo / "big" / "1" / "W.npy", w)
    server = server_factory(repo)
    with Client(server.url, timeout=120, arena_bytes=8 * nbytes) as client:

        def one(k: int) -> np.ndarray:
            y: np.ndarray = client.infer("big", {"X": xs[k]}).as_numpy("Y")
            return y

        with ThreadPoolExecutor(3) as pool:
            for k, y in enumerate(pool.map(one, [0, 1, 2, 0, 1, 2])):
                np.testing.assert_allclose(y, alone[k % 3], rtol=1e-4, atol=1e-4)
    assert "stray_stream" not in server.log()


def test_kernels_run_on_the_compute_stream_and_a_stray_stream_fails_the_batch(tmp_path: Path) -> None:
    """On real CuPy: a model opening its own ``with stream:`` leaves the compute stream current (CuPy's
    stack); one that calls ``Stream.use()`` fails its batch, and the next batch runs on the compute stream."""
    import cupy

    device = open_device("gpu:0")
    assert not device.stream.is_non_blocking  # type: ignore[attr-defined]  # ordered with the null stream
    config = parse_model_config(
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        source="t",
        model_name="m",
    )
    sig = Signature.of(config)
    mode = ["with"]

    class Model:
        def execute(self, inputs: dict[str, Any]) -> dict[str, Any]:
            x = inputs["X"]
            assert cupy.cuda.get_current_stream() == device.stream  # type: ignore[attr-defined]
            if mode[0] == "with":
                side = cupy.cuda.Stream(non_blocking=True)
                side.wait_event(cupy.cuda.get_current_stream().record())
                with side:
                    y = x * 2
                cupy.cuda.get_current_stream().wait_event(side.record())
                return {"Y": y}
            cupy.cuda.Stream(non_blocking=True).use()
            return {"Y": x * 2}

    seg, regions = Segment.create(1 << 16), RegionCache(device)
    try:
        np.frombuffer(seg.buf, np.float32, count=8)[:] = np.arange(8, dtype=np.float32)
        req = BatchRequest(1, (TensorRef("X", "FP32", (2, 4), shm=ShmRef(seg.name, 0, 32)),),
                           (OutputRequest("Y", ShmRef(seg.name, 4096, 32)),))  # fmt: skip
        for m, ok in (("with", True), ("use", False), ("with", True)):
            mode[0] = m
            out = run_batch(Model(), sig, [req], [], regions, device)  # type: ignore[arg-type]
            assert (out.results[0]["status"] == 0) is ok, out.results
            assert cupy.cuda.get_current_stream() == device.stream  # type: ignore[attr-defined]
            if ok:
                got = np.frombuffer(seg.buf, np.float32, count=8, offset=4096)
                np.testing.assert_array_equal(got, np.arange(8, dtype=np.float32) * 2)
        assert device.stray_streams == 1  # type: ignore[attr-defined]
    finally:
        regions.close()
        seg.close()
        device.close()
