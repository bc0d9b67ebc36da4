"""GPU overlap: a batch's inputs land through the copy stream, and the next batch's copies run while the
current batch computes (the device layer, then a worker looking ahead on its socket).

Runs against ``tests/gpu/fake_cupy.py``: its streams log every operation in issue order and flag any
cross-stream access that CUDA would not order (``fake_cupy.HAZARDS``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.gpu import fake_cupy
from zinfer.client import protocol
from zinfer.client.errors import ConfigError
from zinfer.client.protocol import Command, OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchOutcome, BatchRequest, run_batch
from zinfer.workers.batch_io import request_arrays
from zinfer.workers.device import CPU, open_device, prefetch_wanted
from zinfer.workers.gpu import GpuDevice
from zinfer.workers.loader import load_model
from zinfer.workers.model import RequestModel
from zinfer.workers.regions import RegionCache
from zinfer.workers.worker import Worker, WorkerArgs

RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3)).astype(np.float32)
ROW_IN, ROW_OUT = 4 * 4, 3 * 4
OUT_BASE = 1 << 16


def _config(kernel: str = "linear", params: str = "", extra: str = "") -> ModelConfig:
    if kernel == "add":
        tensors = (
            'input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] },\n'
            '        { name: "B" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
            'output [ { name: "S" data_type: TYPE_INT32 dims: [ 2 ] },\n'
            '         { name: "D" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        )
    else:
        tensors = (
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        )
    return parse_model_config(
        f'name: "m"\nbackend: "zinfer"\nmax_batch_size: 16\n{tensors}{extra}'
        f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 0 ] }} ]\n"
        f'parameters [ {{ key: "kernel" value: {{ string_value: "{kernel}" }} }} {params} ]\n',
        source="test",
        model_name="m",
    )


def _prefetch(value: str = "true") -> str:
    return f', {{ key: "gpu_prefetch" value: {{ string_value: "{value}" }} }}'


@pytest.fixture
def seg() -> Iterator[Segment]:
    s = Segment.create(1 << 17)
    yield s
    s.close()


def _rows(seg: Segment) -> np.ndarray:
    """The input rows of the region, as float32 [rows, 4]."""
    return np.frombuffer(seg.buf, np.float32, count=OUT_BASE // 4).reshape(-1, 4)


def _batch(seg: Segment, first_row: int, sizes: Sequence[int], first_id: int = 1) -> list[BatchRequest]:
    """Requests of ``sizes`` rows each, inputs from consecutive rows, outputs to the same rows further on."""
    reqs, row = [], first_row
    for i, n in enumerate(sizes):
        x = ShmRef(seg.name, row * ROW_IN, n * ROW_IN)
        y = ShmRef(seg.name, OUT_BASE + row * ROW_OUT, n * ROW_OUT)
        reqs.append(
            BatchRequest(first_id + i, (TensorRef("X", "FP32", (n, 4), shm=x),), (OutputRequest("Y", y),))
        )
        row += n
    return reqs


def _outputs(seg: Segment, first_row: int, rows: int) -> np.ndarray:
    at = OUT_BASE + first_row * ROW_OUT
    return np.frombuffer(seg.buf, np.float32, count=rows * 3, offset=at).reshape(rows, 3)


def _pieces(reqs: Sequence[BatchRequest], frames: Sequence[Any], regions: RegionCache) -> list[list[Any]]:
    """A batch's host arrays per input, as the worker stages them."""
    per_name: dict[str, list[Any]] = {}
    for req in reqs:
        for name, arr in request_arrays(req, frames, regions).items():
            per_name.setdefault(name, []).append(arr)
    return list(per_name.values())


def _ok(out: BatchOutcome) -> None:
    assert all(r.status == 0 for r in out.results), out.results


# ------------------------------------------------------------------------------------- device layer


def test_the_race_checker_sees_a_missing_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    cp = fake_cupy.install(monkeypatch)
    copy, compute = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    a = cp.empty((4,), np.float32)
    a.set(np.ones(4, np.float32), stream=copy)
    with compute:
        cp.negative(a)
    assert len(fake_cupy.HAZARDS) == 1 and "reads what stream" in fake_cupy.HAZARDS[0]
    fake_cupy.HAZARDS.clear()
    b = cp.empty((4,), np.float32)
    b.set(np.ones(4, np.float32), stream=copy)
    compute.wait_event(copy.record())
    with compute:
        cp.negative(b)
    with copy:  # overwriting what compute reads, with nothing ordering the two, is a race too
        b.set(np.zeros(4, np.float32), stream=copy)
    assert len(fake_cupy.HAZARDS) == 1 and "overwrites what stream" in fake_cupy.HAZARDS[0]


def test_inputs_are_copied_on_the_copy_stream_and_compute_waits_for_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    fake_cupy.install(monkeypatch)
    np.save(tmp_path / "W.npy", W)
    config = _config()
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice) and device.copy_stream is not device.stream
    model = load_model(config, tmp_path, device)
    regions = RegionCache(device)
    _rows(seg)[:6] = RNG.standard_normal((6, 4))
    start = len(fake_cupy.OPS)
    out = run_batch(model, Signature.of(config), _batch(seg, 0, [2, 4]), [], regions, device)
    _ok(out)
    np.testing.assert_allclose(_outputs(seg, 0, 6), _rows(seg)[:6] @ W, rtol=1e-6)
    ops = fake_cupy.OPS[start:]
    copy, compute = device.copy_stream, device.stream
    assert [op.detail for op in ops if op.stream is copy and op.kind == "set"] == [(2, 4), (4, 4)]
    assert not [op for op in ops if op.stream is not copy and op.kind == "set"]  # no H2D elsewhere
    record = next(i for i, op in enumerate(ops) if op.stream is copy and op.kind == "record")
    wait = next(i for i, op in enumerate(ops) if op.stream is compute and op.kind == "wait")
    kernel = next(i for i, op in enumerate(ops) if op.kind == "kernel")
    last_set = max(i for i, op in enumerate(ops) if op.kind == "set")
    assert last_set < record < wait < kernel and ops[wait].detail is ops[record].detail
    assert all(op.stream is compute for op in ops if op.kind in ("kernel", "get"))  # compute and D2H
    assert fake_cupy.HAZARDS == []
    regions.close()


def test_the_next_batch_is_copied_while_the_current_one_computes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    fake_cupy.install(monkeypatch)
    np.save(tmp_path / "W.npy", W)
    config, device = _config(), open_device("gpu:0")
    model, regions, sig = load_model(config, tmp_path, device), RegionCache(device), Signature.of(config)
    _rows(seg)[:9] = RNG.standard_normal((9, 4))
    batch_a, batch_b = _batch(seg, 0, [1, 2]), _batch(seg, 3, [4, 2], first_id=3)
    staged: list[int] = []

    def look_ahead(done: Any) -> None:  # what the worker does when batch B is already on its socket
        if not staged:
            staged.append(device.stage("B", _pieces(batch_b, [], regions)))

    device.on_wait = look_ahead
    assert not device.take_staged("A")
    start = len(fake_cupy.OPS)
    _ok(run_batch(model, sig, batch_a, [], regions, device))
    assert staged == [6 * ROW_IN] and device.staged_batches == 1
    ops = fake_cupy.OPS[start:]
    copy, compute = device.copy_stream, device.stream
    a_kernel = next(i for i, op in enumerate(ops) if op.kind == "kernel")
    a_sync = next(i for i, op in enumerate(ops) if op.stream is compute and op.kind == "sync")
    b_sets = [i for i, op in enumerate(ops) if op.stream is copy and op.kind == "set" and i > a_kernel]
    # B's rows went out on the copy stream after A's compute was enqueued and before A was waited for
    assert [ops[i].detail for i in b_sets] == [(4, 4), (2, 4)] and max(b_sets) < a_sync
    b_event = next(op.detail for op in ops[max(b_sets) :] if op.stream is copy and op.kind == "record")

    assert device.take_staged("B")
    start = len(fake_cupy.OPS)
    _ok(run_batch(model, sig, batch_b, [], regions, device))
    ops = fake_cupy.OPS[start:]
    assert not [op for op in ops if op.kind == "set"]  # B ran on its staged copies
    assert device.staged_hits == 1
    wait = next(i for i, op in enumerate(ops) if op.stream is compute and op.kind == "wait")
    kernel = next(i for i, op in enumerate(ops) if op.kind == "kernel")
    assert ops[wait].detail is b_event and wait < kernel  # compute waits on B's copy event
    np.testing.assert_allclose(_outputs(seg, 0, 9), _rows(seg)[:9] @ W, rtol=1e-6)
    assert fake_cupy.HAZARDS == []
    regions.close()


def test_copies_staged_for_another_batch_are_never_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    fake_cupy.install(monkeypatch)
    np.save(tmp_path / "W.npy", W)
    config, device = _config(), open_device("gpu:0")
    model, regions, sig = load_model(config, tmp_path, device), RegionCache(device), Signature.of(config)
    batch = _batch(seg, 0, [3])
    _rows(seg)[:3] = 1.0
    device.stage("old", _pieces(batch, [], regions))
    _rows(seg)[:3] = 2.0  # the client reused its memory for a later request at the same place
    assert not device.take_staged("new")
    _ok(run_batch(model, sig, batch, [], regions, device))
    assert device.staged_hits == 0
    np.testing.assert_allclose(_outputs(seg, 0, 3), np.full((3, 4), 2.0, np.float32) @ W, rtol=1e-6)
    # and copies left over from the batch they were staged for are dropped when the next batch starts
    device.stage("b1", _pieces(batch, [], regions))
    assert device.take_staged("b1")
    _rows(seg)[:3] = 3.0
    assert not device.take_staged("b2")
    _ok(run_batch(model, sig, batch, [], regions, device))
    np.testing.assert_allclose(_outputs(seg, 0, 3), np.full((3, 4), 3.0, np.float32) @ W, rtol=1e-6)
    assert fake_cupy.HAZARDS == []
    regions.close()


def test_a_region_can_be_dropped_while_copies_from_it_are_staged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    fake_cupy.install(monkeypatch)
    device = open_device("gpu:0")
    assert isinstance(device, GpuDevice)
    regions = RegionCache(device)
    assert device.stage("next", _pieces(_batch(seg, 0, [2, 3]), [], regions)) == 5 * ROW_IN
    mapping = regions._segments[seg.name].map
    assert mapping is not None
    regions.drop(seg.name)
    assert mapping.closed  # the device holds no view of the client's memory: it is unmapped at once
    assert fake_cupy.calls("unregister") == [None]
    assert fake_cupy.ops(device.copy_stream)[-1].kind == "sync"  # the staged copies finished first
    regions.close()


def _add_request(req_id: int, a: ShmRef, b: ShmRef, rows: int, seg: Segment, out: int) -> BatchRequest:
    nbytes = rows * 8
    return BatchRequest(
        req_id,
        (TensorRef("A", "INT32", (rows, 2), shm=a), TensorRef("B", "INT32", (rows, 2), shm=b)),
        (
            OutputRequest("S", ShmRef(seg.name, out, nbytes)),
            OutputRequest("D", ShmRef(seg.name, out + nbytes, nbytes)),
        ),
    )


def test_back_to_back_batches_looking_ahead_match_batches_run_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    """Many batches, each staged while the one before computes, two inputs, some read from the same
    bytes (one staged copy each), some inline: the results are those of running each batch alone."""
    fake_cupy.install(monkeypatch)
    config, device = _config("add"), open_device("gpu:0")
    model, regions, sig = load_model(config, tmp_path, device), RegionCache(device), Signature.of(config)
    ints = np.frombuffer(seg.buf, np.int32, count=OUT_BASE // 4)
    ints[:] = RNG.integers(-1000, 1000, ints.size)
    batches: list[tuple[list[BatchRequest], list[bytes]]] = []
    for k in range(12):
        reqs, frames = [], []
        for j in range(1 + k % 3):
            rows = 1 + (k + j) % 4
            a = ShmRef(seg.name, 8 * (37 * k + 5 * j), rows * 8)
            b = a if j == 1 else ShmRef(seg.name, 8 * (200 + 11 * k + 3 * j), rows * 8)
            out = OUT_BASE + 4096 * (k % 6) + 512 * j
            reqs.append(_add_request(10 * k + j, a, b, rows, seg, out))
        if k % 4 == 3:  # an inline input too
            frames.append(RNG.integers(-9, 9, (2, 2)).astype(np.int32).tobytes())
            both = (TensorRef("A", "INT32", (2, 2), frame=0), TensorRef("B", "INT32", (2, 2), frame=0))
            reqs.append(BatchRequest(10 * k + 9, both, (OutputRequest("S"),)))
        batches.append((reqs, frames))

    def results(out: BatchOutcome, seg: Segment) -> list[Any]:
        got = []
        for r in out.results:
            for t in r.outputs:
                if t.shm is not None:
                    _, off, n = t.shm
                    got.append(bytes(seg.buf[off : off + n]))
                else:
                    assert t.frame is not None
                    got.append(bytes(out.frames[t.frame]))
        return got

    alone = [results(run_batch(model, sig, reqs, frames, regions, device), seg) for reqs, frames in batches]

    running, staged = [0], [0]

    def look_ahead(done: Any) -> None:  # both waits of a batch come here: the next batch is staged once
        k = running[0] + 1
        if k < len(batches) and staged[0] != k:
            reqs, frames = batches[k]
            device.stage(k, _pieces(reqs, frames, regions))
            staged[0] = k

    device.on_wait = look_ahead
    piped = []
    for k, (reqs, frames) in enumerate(batches):
        running[0] = k
        assert device.take_staged(k) == (k > 0)
        piped.append(results(run_batch(model, sig, reqs, frames, regions, device), seg))
    assert piped == alone
    assert device.staged_batches == len(batches) - 1
    assert device.staged_hits == 2 * (len(batches) - 1)  # both inputs of every staged batch
    assert fake_cupy.HAZARDS == []
    regions.close()


def test_the_cpu_device_stages_nothing() -> None:
    assert CPU.stage(1, [[np.zeros((2, 4), np.float32)]]) == 0
    assert CPU.take_staged(1) is False and CPU.on_wait is None


# ------------------------------------------------------------------------------------------ when


class _RequestModel(RequestModel):
    pass


DECOUPLED = "model_transaction_policy { decoupled: true }\n"
ADAPTIVE = "dynamic_batching { zinfer_latency_target_microseconds: 5000 }\n"


@pytest.mark.parametrize(
    "config, model_kind, device, wanted",
    [
        (_config(), "batch", "gpu", False),  # off unless asked for
        (_config(params=_prefetch("true")), "batch", "gpu", True),
        (_config(params=_prefetch("On")), "batch", "gpu", True),
        (_config(params=_prefetch("false")), "batch", "gpu", False),
        (_config(params=_prefetch("true")), "batch", "cpu", False),
        (_config(params=_prefetch("true")), "request", "gpu", False),
        (_config(params=_prefetch("true"), extra=DECOUPLED), "batch", "gpu", False),
        (_config(params=_prefetch("true"), extra=ADAPTIVE), "batch", "gpu", False),
        (_config(params=_prefetch("true"), extra="sequence_batching { }\n"), "batch", "gpu", False),
    ],
)
def test_when_a_worker_looks_ahead(
    monkeypatch: pytest.MonkeyPatch, config: ModelConfig, model_kind: str, device: str, wanted: bool
) -> None:
    fake_cupy.install(monkeypatch)
    dev = open_device("gpu:0" if device == "gpu" else "cpu")
    model: Any = _RequestModel() if model_kind == "request" else object()
    assert prefetch_wanted(config, model, dev) is wanted


def test_a_bad_gpu_prefetch_value_is_a_load_error() -> None:
    with pytest.raises(ConfigError, match="gpu_prefetch must be true or false, got 'maybe'"):
        prefetch_wanted(_config(params=_prefetch("maybe")), object(), CPU)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ worker


def _send(router: zmq.Socket[bytes], identity: bytes, command: Command, header: dict[str, Any]) -> None:
    router.send_multipart([identity, *protocol.encode(command, header)])


def test_a_worker_stages_each_next_batch_from_its_socket_while_the_current_one_computes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, seg: Segment
) -> None:
    """A real worker loop against a broker stand-in that hands out batches the way the broker does: one
    per READY or RESULT it holds. The fake GPU stays "busy" until the worker has the next batch."""
    fake_cupy.install(monkeypatch)
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "zinfer"\nmax_batch_size: 16\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "linear" } }'
        f"{_prefetch()} ]\n"
    )
    np.save(repo / "m" / "1" / "W.npy", W)
    _rows(seg)[:64] = RNG.standard_normal((64, 4))
    sizes = [[1, 2], [3], [2, 2, 1], [4], [1], [2, 3], [1, 1, 1], [2]]
    batches, row = [], 0
    for k, s in enumerate(sizes):
        wire = []
        for r, n in zip(_batch(seg, row, s, first_id=100 * k), s, strict=True):
            x = {"name": "X", "datatype": "FP32", "shape": [n, 4], "shm": list(r.inputs[0].shm or ())}
            y = {"name": "Y", "slot": list(r.outputs[0].slot or ())}
            wire.append({"id": r.id, "inputs": [x], "outputs": [y]})
        batches.append({"batch": k + 1, "requests": wire})
        row += sum(s)

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'w.sock'}"
    router.bind(endpoint)
    identity = b"w-test"
    args = WorkerArgs(endpoint, repo, "m", 1, 0, "gpu:0", identity, os.getppid())
    worker = Worker(args)
    cancels = worker.runtime.cancels  # its ``_batch``: the batch running now (ids 1, 2, ... in order)
    # the GPU "computes" until the worker holds the next batch (or runs the last one); no method of the
    # worker is replaced (a compiled build's Worker is a native class)
    fake_cupy.set_busy(lambda: cancels._batch != len(batches) and not worker._pending)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.serve()), daemon=True)
    thread.start()
    credits, sent, results = 0, 0, {}
    readies = []
    deadline = time.monotonic() + 30
    try:
        while len(results) < len(batches):
            assert time.monotonic() < deadline, f"results {sorted(results)} of {len(batches)}"
            while credits and sent < len(batches):
                _send(router, identity, Command.W_EXECUTE, batches[sent])
                credits, sent = credits - 1, sent + 1
            if not router.poll(100):
                continue
            who, *frames = router.recv_multipart()
            msg = protocol.decode(frames)
            if who.endswith(protocol.HEARTBEAT_SUFFIX):
                _send(router, who, Command.W_HEARTBEAT, {})
                continue
            if msg.command == Command.W_READY:
                readies.append(msg.header)
                credits += 1
            elif msg.command == Command.W_RESULT:
                results[msg.header["batch"]] = msg.header
                credits += 1
        _send(router, identity, Command.W_SHUTDOWN, {})
        thread.join(10)
    finally:
        router.close()
        ctx.term()
    assert codes == [0]
    assert len(readies) == 2 and readies[1].get("slot") == 2  # a second place among the idle instances
    for k, header in results.items():
        assert [r.get("status", 0) for r in header["results"]] == [0] * len(sizes[k - 1]), header
    np.testing.assert_allclose(_outputs(seg, 0, row), _rows(seg)[:row] @ W, rtol=1e-6)
    device = worker.device
    assert isinstance(device, GpuDevice)
    assert device.staged_batches == len(batches) - 1  # every batch but the first was staged ahead
    assert device.staged_hits == len(batches) - 1
    assert fake_cupy.HAZARDS == []
    # every request's rows were copied once, and all but the first batch's while the batch before it
    # was still computing (its kernels enqueued, not yet waited for)
    computing, overlapped, copies = False, 0, 0
    for op in fake_cupy.OPS:
        if op.stream is device.stream and op.kind in ("kernel", "sync"):
            computing = op.kind == "kernel"
        elif op.stream is device.copy_stream and op.kind == "set":
            copies += 1
            overlapped += computing
    assert copies == sum(len(s) for s in sizes) and overlapped == copies - len(sizes[0])


def test_a_cpu_worker_says_ready_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "zinfer"\nmax_batch_size: 16\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        f'parameters [ {{ key: "kernel" value: {{ string_value: "linear" }} }}{_prefetch()} ]\n'
    )
    np.save(repo / "m" / "1" / "W.npy", W)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path / 'w.sock'}"
    router.bind(endpoint)
    worker = Worker(WorkerArgs(endpoint, repo, "m", 1, 0, "cpu", b"w-cpu", os.getppid()))
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    readies: list[Command] = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not readies:
            if router.poll(100):
                who, *frames = router.recv_multipart()
                if not who.endswith(protocol.HEARTBEAT_SUFFIX):
                    readies.append(protocol.decode(frames).command)
        quiet = time.monotonic() + 0.3  # and no second READY follows
        while (left := quiet - time.monotonic()) > 0:
            if router.poll(int(left * 1000) + 1):
                who, *frames = router.recv_multipart()
                if not who.endswith(protocol.HEARTBEAT_SUFFIX):
                    readies.append(protocol.decode(frames).command)
        _send(router, b"w-cpu", Command.W_SHUTDOWN, {})
        thread.join(10)
    finally:
        router.close()
        ctx.term()
    assert readies == [Command.W_READY] and not worker.prefetch and CPU.on_wait is None


def test_the_broker_prefers_an_instance_running_nothing_over_a_second_place() -> None:
    """With look-ahead places, a batch goes to an idle instance before it queues behind a busy one."""
    from collections import deque

    from zinfer.broker.instance_pool import InstancePool
    from zinfer.broker.model_state import ModelState

    def state_of(name: str) -> ModelState:  # real states: the pool is compiled in a wheel build
        text = 'platform: "zinfer_builtin"\nmax_batch_size: 8\n'
        text += 'input [{name: "X", data_type: TYPE_FP32, dims: [1]}]\n'
        text += 'output [{name: "Y", data_type: TYPE_FP32, dims: [1]}]\n'
        config = parse_model_config(text, source="config.pbtxt", model_name=name)
        return ModelState(config, 1, Path("/none"), 2)

    pool = InstancePool(liveness_s=5.0)
    state, other = state_of("m"), state_of("other")
    state.idle = deque([b"a", b"a", b"b"])
    pool.start_batch(state, b"a", [], 0)
    pool.start_batch(other, b"b", [], 0)  # busy with another model: not busy for this one
    pool.idle_first(state)
    assert list(state.idle) == [b"b", b"a", b"a"]
    pool.take_all_batches()
    pool.idle_first(state)
    assert list(state.idle) == [b"b", b"a", b"a"]  # nothing busy: the order stays
