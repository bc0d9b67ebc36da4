"""GPU benchmark: GEMM TFLOP/s through zinfer beside cupy.matmul alone, and H2D/D2H GB/s from a shm region.

(a) ``cupy.matmul`` alone on device-resident operands (the ceiling), and the same GEMM with the input
    copied in from page-locked host memory and the output copied back (the ceiling for host tensors);
(b) the same GEMM as a ``linear`` model on a KIND_GPU instance through a real ``zinfer serve``, inputs and
    outputs in the client's shared-memory arena, at concurrency 1 and 4, without and with ``gpu_prefetch``
    (with it the broker hands the instance the next batch while one runs, and the worker copies that
    batch's inputs in on its copy stream while the current one computes; at concurrency 1 there is never
    a next batch, so the two should match);
(c) the overlap alone, in-process: back-to-back batches through the worker's batch runner on a
    ``GpuDevice``, one at a time, then each staged on the copy stream while the one before computes;
(d) host-to-device and device-to-host bandwidth from a mapped /dev/shm segment, page-locked with
    cudaHostRegister (as a GPU worker does) and pageable.

Every output zinfer returns (through the server and in-process) is checked against ``cupy.matmul`` of the
same operands; a wrong result stops the bench. It first checks that /dev/shm has room for the client arena
and the regions (about 1.5 GiB at the default sizes; containers default to 64 MiB) and says so if not.

Usage: ``python bench/bench_gpu.py [--quick] [--m 4096 --k 8192 --n 8192 --dtype fp16]``. Needs CuPy and a
GPU. Results go to bench/results/bench_gpu.json (``--out`` for elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "bench_gpu.json"
sys.path.insert(0, str(ROOT))

from tests.conftest import start_server  # noqa: E402
from zinfer.client import Client  # noqa: E402
from zinfer.client.shm import Segment  # noqa: E402


def _cupy() -> Any:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        return cupy
    except Exception as exc:
        sys.exit(f"bench_gpu needs CuPy and a GPU: {exc}")


SHM = "/dev/shm"


def check_shm(need: int) -> None:
    """Exit with a clear message when /dev/shm cannot hold ``need`` bytes."""
    try:
        st = os.statvfs(SHM)
    except OSError as exc:
        sys.exit(f"bench_gpu: {SHM} is not usable ({exc}); it needs about {need / 2**30:.1f} GiB there")
    free = st.f_bavail * st.f_frsize
    if free < need:
        sys.exit(
            f"bench_gpu: {SHM} has {free / 2**20:.0f} MiB free, the bench needs about {need / 2**30:.1f} GiB "
            "(the client arena and the shared-memory regions live there). Containers default to 64 MiB: "
            "docker run --shm-size=4g, or in Kubernetes mount an emptyDir with medium: Memory at /dev/shm; "
            "or run with smaller --m/--k/--n."
        )


def shm_needed(x: np.ndarray, w: np.ndarray) -> int:
    """The most /dev/shm one phase of the bench holds at once, with a margin."""
    y_bytes = x.shape[0] * w.shape[1] * x.itemsize
    arena = 8 * (x.nbytes + y_bytes) + (64 << 20)
    return int(max(arena, 2 * x.nbytes + y_bytes, 256 << 20) * 1.1)


def check_output(label: str, got: np.ndarray, want: np.ndarray) -> None:
    """zinfer's GEMM output against cupy.matmul's: FP16 sums of 8192 terms differ in the last bits."""
    tol = 2e-2 if got.dtype == np.float16 else 1e-3
    if got.shape != want.shape or not np.allclose(got.astype(np.float32), want.astype(np.float32),
                                                  rtol=tol, atol=tol):  # fmt: skip
        same = got.shape == want.shape
        diff = np.abs(got.astype(np.float32) - want.astype(np.float32)).max() if same else -1
        raise SystemExit(f"bench_gpu: {label}: zinfer's output differs from cupy.matmul (max |diff| {diff})")


def _gpu_time_s(cp: Any, fn: Any, iters: int) -> float:
    """Mean seconds per call of ``fn`` measured with CUDA events on the current stream."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return float(cp.cuda.get_elapsed_time(start, end)) / 1000 / iters


def gemm_alone(cp: Any, x: np.ndarray, w: np.ndarray, iters: int) -> dict[str, float]:
    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    xd, wd = cp.asarray(x), cp.asarray(w)
    resident = _gpu_time_s(cp, lambda: cp.matmul(xd, wd), iters)
    pinned_x = cp.cuda.alloc_pinned_memory(x.nbytes)
    hx = np.frombuffer(pinned_x, x.dtype, x.size).reshape(x.shape)
    hx[:] = x
    pinned_y = cp.cuda.alloc_pinned_memory(x.shape[0] * w.shape[1] * x.itemsize)
    hy = np.frombuffer(pinned_y, x.dtype, x.shape[0] * w.shape[1]).reshape(x.shape[0], w.shape[1])

    def with_copies() -> None:
        xd.set(hx)
        cp.matmul(xd, wd).get(out=hy, blocking=False)

    host = _gpu_time_s(cp, with_copies, iters)
    return {
        "matmul_ms": resident * 1e3,
        "matmul_tflops": flops / resident / 1e12,
        "h2d_matmul_d2h_ms": host * 1e3,
        "h2d_matmul_d2h_tflops": flops / host / 1e12,
    }


def _gemm_config(name: str, x: np.ndarray, w: np.ndarray, dtype: str, prefetch: bool) -> str:
    return (
        f'name: "{name}"\nbackend: "zinfer"\nmax_batch_size: {x.shape[0]}\n'
        f'input [ {{ name: "X" data_type: TYPE_{dtype.upper()} dims: [ {x.shape[1]} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_{dtype.upper()} dims: [ {w.shape[1]} ] }} ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters [ { key: "kernel" value: { string_value: "linear" } },\n'
        f'             {{ key: "gpu_prefetch" value: {{ string_value: "{str(prefetch).lower()}" }} }} ]\n'
    )


def gemm_through_zinfer(
    x: np.ndarray, w: np.ndarray, iters: int, dtype: str, want: np.ndarray
) -> dict[str, dict[str, float]]:
    """The GEMM through a server: model ``gemm`` one batch at a time, ``gemm_ahead`` with gpu_prefetch;
    outputs checked against ``want`` (cupy.matmul alone), the first ones and the concurrent ones."""
    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    repo = Path(tempfile.mkdtemp(prefix="zbg-"))
    for name, prefetch in (("gemm", False), ("gemm_ahead", True)):
        (repo / name / "1").mkdir(parents=True)
        np.save(repo / name / "1" / "W.npy", w)
        (repo / name / "config.pbtxt").write_text(_gemm_config(name, x, w, dtype, prefetch))
    server = start_server(repo, ready_timeout=120)
    results: dict[str, dict[str, float]] = {}
    try:
        arena = 8 * (x.nbytes + x.shape[0] * w.shape[1] * x.itemsize) + (64 << 20)
        with Client(server.url, timeout=120, arena_bytes=arena) as client:
            xs = client.empty(x.shape, x.dtype)  # in shared memory: sent without a copy
            xs[:] = x
            for model in ("gemm", "gemm_ahead"):
                out = results[model] = {}
                for _ in range(3):
                    check_output(model, client.infer(model, {"X": xs}).as_numpy("Y"), want)
                for conc in (1, 4):
                    n = iters * conc
                    t0 = time.perf_counter()
                    if conc == 1:
                        for _ in range(n):
                            client.infer(model, {"X": xs})
                    else:
                        with ThreadPoolExecutor(conc) as pool:
                            list(pool.map(lambda _, m=model: client.infer(m, {"X": xs}), range(n)))
                    elapsed = (time.perf_counter() - t0) / n
                    with ThreadPoolExecutor(conc) as pool:  # and the results of concurrent requests
                        for y in pool.map(lambda _, m=model: client.infer(m, {"X": xs}).as_numpy("Y"),
                                          range(conc)):  # fmt: skip
                            check_output(f"{model} c{conc}", y, want)
                    out[f"c{conc}_ms_per_request"] = elapsed * 1e3
                    out[f"c{conc}_tflops"] = flops / elapsed / 1e12
                stats = client.statistics(model)["model_stats"][0]["inference_stats"]
                for key in ("compute_input", "compute_infer", "compute_output"):
                    d = stats[key]
                    out[f"{key}_ms_mean"] = d["ns"] / max(1, d["count"]) / 1e6
        results["gemm_ahead"]["look_ahead_on"] = float("event=gpu_prefetch model=gemm_ahead" in server.log())
    finally:
        server.stop()
        shutil.rmtree(server.runtime_dir.parent, ignore_errors=True)
        server.log_path.unlink(missing_ok=True)
        shutil.rmtree(repo, ignore_errors=True)
    return results


def overlap_in_process(
    x: np.ndarray, w: np.ndarray, iters: int, dtype: str, want: np.ndarray
) -> dict[str, float]:
    """Back-to-back batches through ``run_batch`` on a ``GpuDevice``: one at a time, then each batch's
    inputs staged on the copy stream (from a page-locked region) while the batch before computes."""
    from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
    from zinfer.modelconfig.model_config import parse_model_config
    from zinfer.modelconfig.signature import Signature
    from zinfer.workers.batch import BatchRequest, run_batch
    from zinfer.workers.batch_io import request_arrays
    from zinfer.workers.gpu import GpuDevice
    from zinfer.workers.loader import load_model
    from zinfer.workers.regions import RegionCache

    repo = Path(tempfile.mkdtemp(prefix="zbo-"))
    np.save(repo / "W.npy", w)
    config = parse_model_config(_gemm_config("g", x, w, dtype, False), source="bench", model_name="g")
    device = GpuDevice(0)
    model, sig = load_model(config, repo, device), Signature.of(config)
    y_bytes = x.shape[0] * w.shape[1] * x.itemsize
    seg = Segment.create(2 * x.nbytes + y_bytes)
    regions = RegionCache(device)  # page-locks the segment when it is first mapped, as a worker does
    try:
        for k in range(2):  # two input slots, so consecutive batches read different memory
            np.frombuffer(seg.buf, x.dtype, count=x.size, offset=k * x.nbytes)[:] = x.reshape(-1)
        y_slot = (OutputRequest("Y", ShmRef(seg.name, 2 * x.nbytes, y_bytes)),)
        reqs = [
            [
                BatchRequest(
                    k,
                    (TensorRef("X", dtype.upper(), x.shape, shm=ShmRef(seg.name, k * x.nbytes, x.nbytes)),),
                    y_slot,
                )
            ]
            for k in range(2)
        ]

        def run(look_ahead: bool) -> float:
            running, staged = [0], [-1]

            def stage_next(done: Any) -> None:  # what the worker does with the next EXECUTE in hand
                k = running[0] + 1
                if k < iters and staged[0] != k:  # once per batch (both of a batch's waits come here)
                    device.stage(k, [[request_arrays(reqs[k % 2][0], [], regions)["X"]]])
                    staged[0] = k

            run_batch(model, sig, reqs[0], [], regions, device)  # warm-up
            device.on_wait = stage_next if look_ahead else None
            t0 = time.perf_counter()
            for k in range(iters):
                running[0] = k
                device.take_staged(k)
                run_batch(model, sig, reqs[k % 2], [], regions, device)
            device.on_wait = None
            return (time.perf_counter() - t0) / iters

        def output() -> np.ndarray:
            count = x.shape[0] * w.shape[1]
            return np.frombuffer(seg.buf, x.dtype, count=count, offset=2 * x.nbytes).reshape(x.shape[0], -1)

        serial = run(look_ahead=False)
        check_output("in-process serial", output(), want)
        overlapped = run(look_ahead=True)
        check_output("in-process look-ahead", output(), want)
        return {
            "serial_ms_per_batch": serial * 1e3,
            "look_ahead_ms_per_batch": overlapped * 1e3,
            "speedup": serial / overlapped,
            "staged_hits": float(device.staged_hits),
        }
    finally:
        regions.close()
        seg.close()
        device.close()
        shutil.rmtree(repo, ignore_errors=True)


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _pin(device: Any, seg: Segment) -> bool:
    """``device.pin(seg)`` (cudaHostRegister, as a GPU worker does when it maps a client region); False when
    the worker's ``event=host_register_failed`` warning says the region stayed pageable (a device logs it
    once: ``shm_bandwidth`` pins with a fresh device)."""
    events = _Events()
    logger = logging.getLogger("zinfer.workers.gpu")
    logger.addHandler(events)
    try:
        device.pin(seg)
    finally:
        logger.removeHandler(events)
    return not any("event=host_register_failed" in m for m in events.messages)


def _copy_rates(cp: Any, device: Any, seg: Segment, iters: int) -> dict[str, float]:
    nbytes = seg.size
    host = np.frombuffer(seg.buf, np.uint8, count=nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, cp.uint8)
    out: dict[str, float] = {}
    for label in ("pageable", "registered"):
        if label == "registered":
            if not _pin(device, seg):
                out["register_failed"] = 1.0
                break
        h2d = _gpu_time_s(cp, lambda: dev.set(host), iters)
        d2h = _gpu_time_s(cp, lambda: dev.get(out=host, blocking=False), iters)
        out[f"h2d_{label}_gbps"] = nbytes / h2d / 1e9
        out[f"d2h_{label}_gbps"] = nbytes / d2h / 1e9
    return out


def shm_bandwidth(cp: Any, nbytes: int, iters: int) -> dict[str, float]:
    from zinfer.workers.gpu import GpuDevice

    device = GpuDevice(0)
    seg = Segment.create(nbytes)
    try:
        return _copy_rates(cp, device, seg, iters)
    finally:
        device.unpin(seg)
        seg.close()
        device.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON results go")
    a = p.parse_args()
    iters = 5 if a.quick else 20
    dtype = np.float16 if a.dtype == "fp16" else np.float32
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((a.m, a.k)) / np.sqrt(a.k)).astype(dtype)
    w = (rng.standard_normal((a.k, a.n)) / np.sqrt(a.k)).astype(dtype)
    check_shm(shm_needed(x, w))
    cp = _cupy()
    want = cp.matmul(cp.asarray(x), cp.asarray(w)).get()  # the reference every zinfer output must match
    props = cp.cuda.runtime.getDeviceProperties(0)
    result: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"gpu": props["name"].decode(errors="replace"), "python": platform.python_version()},
        "gemm": {"m": a.m, "k": a.k, "n": a.n, "dtype": a.dtype},
        "cupy_alone": gemm_alone(cp, x, w, iters),
        "zinfer": gemm_through_zinfer(x, w, iters, a.dtype, want),
        "overlap_in_process": overlap_in_process(x, w, max(iters, 10), a.dtype, want),
        "shm_copies_256MiB": shm_bandwidth(cp, 256 << 20, iters),
    }
    alone, plain, ahead = result["cupy_alone"], result["zinfer"]["gemm"], result["zinfer"]["gemm_ahead"]
    result["ratios"] = {
        "zinfer_c1_vs_matmul": plain["c1_tflops"] / alone["matmul_tflops"],
        "zinfer_c4_vs_h2d_matmul_d2h": plain["c4_tflops"] / alone["h2d_matmul_d2h_tflops"],
        "prefetch_c4_vs_plain_c4": ahead["c4_tflops"] / plain["c4_tflops"],
        "prefetch_c4_vs_h2d_matmul_d2h": ahead["c4_tflops"] / alone["h2d_matmul_d2h_tflops"],
        "look_ahead_vs_serial_in_process": result["overlap_in_process"]["speedup"],
    }
    result["outputs_checked"] = "every zinfer output matched cupy.matmul"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
