"""The GPU path's stream rules, against a fake CuPy that follows CuPy's own (issue 19).

``tests/gpu/fake_cupy.py`` follows CuPy's stream stack (``Stream.use()`` does not push; leaving ``with`` makes
the top of the stack current), its memory pool (a freed block goes back to the arena of the stream that
allocated it and is reused there at once), and CUDA's null-stream rules (blocking streams are ordered with
it, non-blocking ones are not). With those, a worker's kernels must stay on its compute stream batch after
batch, the look-ahead must sleep rather than spin, and foreign GPU arrays must be accepted as outputs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.gpu import fake_cupy
from zinfer.broker.devices import worker_environment
from zinfer.client import protocol
from zinfer.client.errors import ConfigError
from zinfer.client.protocol import Command, OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchRequest, run_batch
from zinfer.workers.batch_io import request_arrays
from zinfer.workers.device import open_device
from zinfer.workers.gpu import GpuDevice
from zinfer.workers.regions import RegionCache
from zinfer.workers.worker import Worker, WorkerArgs

W = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
CONFIG = parse_model_config(
    'name: "m"\nbackend: "python"\nmax_batch_size: 16\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n",
    source="test",
    model_name="m",
)
SIG = Signature.of(CONFIG)


@pytest.fixture
def seg() -> Iterator[Segment]:
    s = Segment.create(1 << 16)
    yield s
    s.close()


def _request(seg: Segment, req_id: int, row: int, rows: int) -> BatchRequest:
    x = ShmRef(seg.name, row * 16, rows * 16)
    y = ShmRef(seg.name, (1 << 15) + row * 12, rows * 12)
    return BatchRequest(req_id, (TensorRef("X", "FP32", (rows, 4), shm=x),), (OutputRequest("Y", y),))


def _x(seg: Segment) -> np.ndarray:
    return np.frombuffer(seg.buf, np.float32, count=(1 << 15) // 4).reshape(-1, 4)


def _y(seg: Segment, row: int, rows: int) -> np.ndarray:
    return np.frombuffer(seg.buf, np.float32, count=rows * 3, offset=(1 << 15) + row * 12).reshape(rows, 3)


class _Model:
    """A native model; ``body`` runs before the GEMM (to use streams the way models do)."""

    def __init__(self, cp: Any, body: Any = None) -> None:
        self.cp, self.body, self.w = cp, body, cp.asarray(W)
        self.kept: Any = None

    def execute(self, inputs: dict[str, Any]) -> dict[str, Any]:
        x = inputs["X"]
        if self.body is not None:
            self.body(self, x)
        return {"Y": self.cp.matmul(x, self.w)}


# ------------------------------------------------------------------------------- the fake, as CuPy


def test_the_fake_follows_cupys_stream_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = fake_cupy.install(monkeypatch)
    null, a, b = fake_cupy.NULL_STREAM, cp.cuda.Stream(), cp.cuda.Stream()
    assert cp.cuda.get_current_stream() is null
    a.use()  # current, but not pushed
    assert cp.cuda.get_current_stream() is a
    with b:
        assert cp.cuda.get_current_stream() is b
    assert cp.cuda.get_current_stream() is null  # CuPy's test_mix_use_context: back to the stack's top
    with a:
        b.use()
        with b:
            pass
        assert cp.cuda.get_current_stream() is a  # popped back to a, whatever use() did inside
    seen: list[Any] = []
    with a:
        thread = threading.Thread(target=lambda: seen.append(cp.cuda.get_current_stream()))
        thread.start()
        thread.join()
    assert seen == [null]  # current streams are per thread


def test_the_fake_pool_reuses_a_freed_block_on_its_own_stream_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = fake_cupy.install(monkeypatch)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with s1:
        a = cp.empty((64,), np.float32)
    where = a.ctypes.data
    view = a[8:]
    del a
    with s1:
        b = cp.empty((64,), np.float32)
    assert b.ctypes.data != where  # a view still holds the block
    freed = {where, b.ctypes.data}
    del view, b
    with s2:
        c = cp.empty((64,), np.float32)
    assert c.ctypes.data not in freed  # another stream's arena
    with s1:
        d = cp.empty((60,), np.float32)  # the same 512-byte bin
    assert d.ctypes.data in freed and fake_cupy.POOL.reused == 1


def test_a_blocking_stream_is_ordered_with_the_null_stream_and_a_non_blocking_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cp = fake_cupy.install(monkeypatch)
    for non_blocking, hazards, n in ((False, 0, 4), (True, 1, 1024)):  # sizes apart: no block reused
        fake_cupy.HAZARDS.clear()
        s = cp.cuda.Stream(non_blocking=non_blocking)
        a = cp.empty((n,), np.float32)
        a.set(np.ones(n, np.float32), stream=s)
        cp.negative(a)  # on the null stream (nothing is current)
        assert len(fake_cupy.HAZARDS) == hazards, fake_cupy.HAZARDS


# ------------------------------------------------------------------------------- the compute stream


def _kernel_streams(start: int) -> set[Any]:
    return {op.stream for op in fake_cupy.OPS[start:] if op.kind in ("kernel", "get")}


def test_kernels_stay_on_the_compute_stream_batch_after_batch(
    monkeypatch: pytest.MonkeyPatch, seg: Segment
) -> None:
    """Input allocations leave ``with copy_stream:`` every batch, and the model opens a ``with`` block of
    its own: the matmul, and the copies back, still run on the compute stream in every batch (before the
    fix, ``Stream.use()`` in the constructor was undone by the first ``with`` block and everything from
    then on ran on the null stream, unordered with the copies)."""
    cp = fake_cupy.install(monkeypatch)
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice) and not device.stream.is_non_blocking

    def own_stream(model: _Model, x: Any) -> None:
        side = cp.cuda.Stream(non_blocking=True)
        side.wait_event(cp.cuda.get_current_stream().record())  # after compute's wait for the copies
        with side:
            cp.negative(x)
        side.synchronize()

    model, regions = _Model(cp, own_stream), RegionCache(device)
    _x(seg)[:12] = np.random.default_rng(1).standard_normal((12, 4))
    start = len(fake_cupy.OPS)
    for k in range(4):
        reqs = [_request(seg, 10 * k, 3 * k, 1), _request(seg, 10 * k + 1, 3 * k + 1, 2)]
        out = run_batch(model, SIG, reqs, [], regions, device)  # type: ignore[arg-type]
        assert [r.status for r in out.results] == [0, 0], out.results
        assert cp.cuda.get_current_stream() is device.stream
    np.testing.assert_allclose(_y(seg, 0, 12), _x(seg)[:12] @ W, rtol=1e-6)
    gemms = [op for op in fake_cupy.OPS[start:] if op.kind == "kernel" and op.detail == "matmul"]
    assert len(gemms) == 4 and all(op.stream is device.stream for op in gemms)
    assert all(op.stream is device.stream for op in fake_cupy.OPS[start:] if op.kind == "get")
    assert fake_cupy.HAZARDS == [] and device.stray_streams == 0
    regions.close()
    device.close()


def test_a_model_that_leaves_another_stream_current_fails_its_batch_and_the_next_is_fine(
    monkeypatch: pytest.MonkeyPatch, seg: Segment
) -> None:
    cp = fake_cupy.install(monkeypatch)
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice)
    stray = [True]

    def use_own(model: _Model, x: Any) -> None:
        if stray[0]:
            cp.cuda.Stream(non_blocking=True).use()

    model, regions = _Model(cp, use_own), RegionCache(device)
    _x(seg)[:4] = 1.0
    out = run_batch(model, SIG, [_request(seg, 1, 0, 2)], [], regions, device)  # type: ignore[arg-type]
    assert out.results[0].status != 0 and "left CUDA stream" in out.results[0].error
    assert device.stray_streams == 1 and cp.cuda.get_current_stream() is device.stream
    stray[0] = False
    start = len(fake_cupy.OPS)
    out = run_batch(model, SIG, [_request(seg, 2, 2, 2)], [], regions, device)  # type: ignore[arg-type]
    assert out.results[0].status == 0, out.results
    assert _kernel_streams(start) == {device.stream}
    np.testing.assert_allclose(_y(seg, 2, 2), _x(seg)[2:4] @ W, rtol=1e-6)
    regions.close()
    device.close()


@pytest.mark.parametrize("copy", [False, True])
def test_an_input_kept_past_execute_can_be_overwritten_and_a_copy_cannot(
    monkeypatch: pytest.MonkeyPatch, seg: Segment, copy: bool
) -> None:
    """Why the docstring says to copy an input a model keeps: the pool hands its block back to the copy
    stream's arena when the model drops it mid-batch, and the next staged copy rewrites it while a
    kernel of the running batch still reads it."""
    cp = fake_cupy.install(monkeypatch)
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice)

    def keep(model: _Model, x: Any) -> None:
        previous = model.kept
        model.kept = x.copy() if copy else x
        if previous is not None:
            cp.add(x, previous)  # reads the kept input, then drops it
        del previous

    model, regions = _Model(cp, keep), RegionCache(device)
    _x(seg)[:16] = 1.0
    reqs = [[_request(seg, k, 4 * k, 4)] for k in range(4)]
    running = [0]

    def stage_next(wait: Any) -> None:
        k = running[0] + 1
        if k < len(reqs):
            device.stage(k, [[request_arrays(reqs[k][0], [], regions)["X"]]])

    device.on_wait = stage_next
    for k in range(len(reqs)):
        running[0] = k
        device.take_staged(k)
        run_batch(model, SIG, reqs[k], [], regions, device)  # type: ignore[arg-type]
    overwritten = [h for h in fake_cupy.HAZARDS if "overwrites what stream" in h]
    assert bool(overwritten) is not copy, fake_cupy.HAZARDS
    regions.close()
    device.close()


# ------------------------------------------------------------------------------- outputs, warm-up


class _ForeignCai:
    """A CUDA array of another library (torch's shape): ``__cuda_array_interface__``, no NumPy."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        d = self.data
        return {"shape": d.shape, "typestr": d.dtype.str, "data": (d.ctypes.data, False), "version": 3}

    def __array__(self, *_: Any, **__: Any) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy")


class _ForeignDlpack(_ForeignCai):
    def __init__(self, data: np.ndarray) -> None:
        super().__init__(data)
        self.streams: list[Any] = []

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        self.streams.append(stream)
        return self.data.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def test_outputs_of_other_gpu_libraries_are_accepted(monkeypatch: pytest.MonkeyPatch, seg: Segment) -> None:
    cp = fake_cupy.install(monkeypatch)
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice)
    y = np.arange(12, dtype=np.float32).reshape(4, 3)
    via_cai = device.as_output(_ForeignCai(y.copy()))
    assert isinstance(via_cai, cp.ndarray) and np.array_equal(via_cai.view(np.ndarray), y)
    assert fake_cupy.calls("cuda_array_interface") == [(4, 3)]
    producer = _ForeignDlpack(y.copy())
    via_dlpack = device.as_output(producer)
    assert isinstance(via_dlpack, cp.ndarray) and np.array_equal(via_dlpack.view(np.ndarray), y)
    assert producer.streams == [device.stream.ptr]  # asked for it on the compute stream
    assert type(device.as_output(np.ones(2))) is np.ndarray  # a host array (NumPy has __dlpack__ too)

    regions = RegionCache(device)

    class Torchy:
        def execute(self, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"Y": _ForeignCai(np.ascontiguousarray(inputs["X"].view(np.ndarray)[:, :3] * 2))}

    _x(seg)[:2] = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = run_batch(Torchy(), SIG, [_request(seg, 1, 0, 2)], [], regions, device)  # type: ignore[arg-type]
    assert out.results[0].status == 0, out.results
    np.testing.assert_array_equal(_y(seg, 0, 2), _x(seg)[:2, :3] * 2)
    regions.close()
    device.close()


def test_a_gpu_whose_cuda_libraries_fail_fails_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = fake_cupy.install(monkeypatch)

    def no_cublas(*_: Any) -> Any:
        raise RuntimeError("libcublas.so.12: cannot open shared object file")

    monkeypatch.setattr(cp, "matmul", no_cublas)
    with pytest.raises(ConfigError, match=r"run a kernel .*libcublas.*gpu-cuda12.*cupy-cuda13x\[ctk\]"):
        open_device("gpu:0")


# ------------------------------------------------------------------------------- one GPU per worker


def test_each_gpu_worker_sees_only_its_own_gpu() -> None:
    env = worker_environment("gpu:1", {"PATH": "/bin"})
    assert env is not None and env["CUDA_VISIBLE_DEVICES"] == "1" and env["ZINFER_DEVICE"] == "gpu:1"
    assert env["PATH"] == "/bin"
    mapped = worker_environment("gpu:1", {"CUDA_VISIBLE_DEVICES": "3, GPU-8f1e,5"})
    assert mapped is not None and mapped["CUDA_VISIBLE_DEVICES"] == "GPU-8f1e"  # the server's second GPU
    assert worker_environment("gpu:4", {"CUDA_VISIBLE_DEVICES": "3,5"}) is None  # left alone: load says why
    assert worker_environment("cpu", {"CUDA_VISIBLE_DEVICES": "0"}) is None


def test_a_narrowed_worker_uses_cuda_device_0_and_keeps_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupy.install(monkeypatch, device_count=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.setenv("ZINFER_DEVICE", "gpu:2")
    device = open_device("gpu:2")
    assert isinstance(device, GpuDevice) and device.id == 2 and device.ordinal == 0
    assert fake_cupy.calls("device")[:1] == [0]
    device.close()
    monkeypatch.delenv("ZINFER_DEVICE")  # not narrowed by the supervisor: the index is CUDA's
    with pytest.raises(ConfigError, match="only 1 GPU"):
        open_device("gpu:2")


# ------------------------------------------------------------------------------- the look-ahead sleeps


def test_the_look_ahead_sleeps_while_the_gpu_computes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    """A worker with gpu_prefetch and a batch that "computes" for 0.4 s with nothing else to do: it waits
    in poll on its socket and the device's wake-up pipe, asking the event a handful of times (the spin it
    replaces asked it hundreds of thousands of times, on a core at 100%)."""
    fake_cupy.install(monkeypatch)
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "zinfer"\nmax_batch_size: 16\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "linear" } },\n'
        '             { key: "gpu_prefetch" value: { string_value: "true" } } ]\n'
    )
    np.save(repo / "m" / "1" / "W.npy", W)
    _x(seg)[:2] = 1.0
    req = _request(seg, 7, 0, 2)
    x = {"name": "X", "datatype": "FP32", "shape": [2, 4], "shm": list(req.inputs[0].shm or ())}
    wire = {"id": 7, "inputs": [x], "outputs": [{"name": "Y", "slot": list(req.outputs[0].slot or ())}]}
    execute = protocol.encode(Command.W_EXECUTE, {"batch": 1, "requests": [wire]})
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'w.sock'}"
    router.bind(endpoint)
    worker = Worker(WorkerArgs(endpoint, repo, "m", 1, 0, "gpu:0", b"w-sleep", os.getppid()))
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    result: dict[str, Any] = {}
    cpu = 0.0
    try:
        deadline = time.monotonic() + 20
        readies = 0
        while not result:
            assert time.monotonic() < deadline
            if not router.poll(100):
                continue
            who, *frames = router.recv_multipart()
            if who.endswith(protocol.HEARTBEAT_SUFFIX):
                continue
            msg = protocol.decode(frames)
            if msg.command == Command.W_READY:
                readies += 1
                if readies == 2:  # loaded, warmed up: now each event is "computing" for 0.4 s
                    fake_cupy.COMPUTE_S = 0.4
                    fake_cupy.QUERIES[0] = 0
                    cpu = time.process_time()
                    router.send_multipart([b"w-sleep", *execute])
            elif msg.command == Command.W_RESULT:
                result = msg.header
                cpu = time.process_time() - cpu
        router.send_multipart([b"w-sleep", *protocol.encode(Command.W_SHUTDOWN, {})])
        thread.join(10)
    finally:
        router.close()
        ctx.term()
    assert result["results"][0].get("status", 0) == 0, result
    np.testing.assert_allclose(_y(seg, 0, 2), _x(seg)[:2] @ W, rtol=1e-6)
    assert fake_cupy.QUERIES[0] < 50, fake_cupy.QUERIES[0]
    assert cpu < 0.3, cpu  # the whole process, over at least 0.8 s of "compute" (two waits)
