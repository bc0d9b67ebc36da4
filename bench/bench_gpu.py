"""GPU benchmark: GEMM TFLOP/s through zinfer beside cupy.matmul alone, and H2D/D2H GB/s from a shm region.

(a) ``cupy.matmul`` alone on device-resident operands (the ceiling), and the same GEMM with the input
    copied in from page-locked host memory and the output copied back (the ceiling for host tensors);
(b) the same GEMM as a ``linear`` model on a KIND_GPU instance through a real ``zinfer serve``, inputs and
    outputs in the client's shared-memory arena, at concurrency 1 and 4;
(c) host-to-device and device-to-host bandwidth from a mapped /dev/shm segment, page-locked with
    cudaHostRegister (as a GPU worker does) and pageable.

Usage: ``python bench/bench_gpu.py [--quick] [--m 4096 --k 8192 --n 8192 --dtype fp16]``. Needs CuPy and a
GPU. Results go to bench/results/bench_gpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
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


def gemm_through_zinfer(x: np.ndarray, w: np.ndarray, iters: int, dtype: str) -> dict[str, float]:
    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    repo = Path(tempfile.mkdtemp(prefix="zbg-"))
    (repo / "gemm" / "1").mkdir(parents=True)
    np.save(repo / "gemm" / "1" / "W.npy", w)
    (repo / "gemm" / "config.pbtxt").write_text(
        f'name: "gemm"\nbackend: "zinfer"\nmax_batch_size: {x.shape[0]}\n'
        f'input [ {{ name: "X" data_type: TYPE_{dtype.upper()} dims: [ {x.shape[1]} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_{dtype.upper()} dims: [ {w.shape[1]} ] }} ]\n'
        "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
        'parameters { key: "kernel" value: { string_value: "linear" } }\n'
    )
    server = start_server(repo, ready_timeout=120)
    out: dict[str, float] = {}
    try:
        arena = 4 * (x.nbytes + x.shape[0] * w.shape[1] * x.itemsize) + (64 << 20)
        with Client(server.url, timeout=120, arena_bytes=arena) as client:
            xs = client.empty(x.shape, x.dtype)  # in shared memory: sent without a copy
            xs[:] = x
            for _ in range(3):
                client.infer("gemm", {"X": xs})
            for conc in (1, 4):
                n = iters * conc
                t0 = time.perf_counter()
                if conc == 1:
                    for _ in range(n):
                        client.infer("gemm", {"X": xs})
                else:
                    with ThreadPoolExecutor(conc) as pool:
                        list(pool.map(lambda _: client.infer("gemm", {"X": xs}), range(n)))
                elapsed = (time.perf_counter() - t0) / n
                out[f"c{conc}_ms_per_request"] = elapsed * 1e3
                out[f"c{conc}_tflops"] = flops / elapsed / 1e12
            stats = client.statistics("gemm")["model_stats"][0]["inference_stats"]
            for key in ("compute_input", "compute_infer", "compute_output"):
                d = stats[key]
                out[f"{key}_ms_mean"] = d["ns"] / max(1, d["count"]) / 1e6
    finally:
        server.stop()
        shutil.rmtree(server.runtime_dir.parent, ignore_errors=True)
        server.log_path.unlink(missing_ok=True)
        shutil.rmtree(repo, ignore_errors=True)
    return out


def _copy_rates(cp: Any, device: Any, seg: Segment, iters: int) -> dict[str, float]:
    nbytes = seg.size
    host = np.frombuffer(seg.buf, np.uint8, count=nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, cp.uint8)
    out: dict[str, float] = {}
    for label in ("pageable", "registered"):
        if label == "registered":
            device.pin(seg)  # cudaHostRegister, as a GPU worker does when it maps a client region
            if seg.name not in device._pinned:
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
    a = p.parse_args()
    cp = _cupy()
    iters = 5 if a.quick else 20
    dtype = np.float16 if a.dtype == "fp16" else np.float32
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((a.m, a.k)) / np.sqrt(a.k)).astype(dtype)
    w = (rng.standard_normal((a.k, a.n)) / np.sqrt(a.k)).astype(dtype)
    props = cp.cuda.runtime.getDeviceProperties(0)
    result: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"gpu": props["name"].decode(errors="replace"), "python": platform.python_version()},
        "gemm": {"m": a.m, "k": a.k, "n": a.n, "dtype": a.dtype},
        "cupy_alone": gemm_alone(cp, x, w, iters),
        "zinfer": gemm_through_zinfer(x, w, iters, a.dtype),
        "shm_copies_256MiB": shm_bandwidth(cp, 256 << 20, iters),
    }
    alone = result["cupy_alone"]
    result["ratios"] = {
        "zinfer_c1_vs_matmul": result["zinfer"]["c1_tflops"] / alone["matmul_tflops"],
        "zinfer_c4_vs_h2d_matmul_d2h": result["zinfer"]["c4_tflops"] / alone["h2d_matmul_d2h_tflops"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
