"""KIND_GPU ONNX models: ONNX Runtime's CUDA execution provider on the worker's device buffers (I/O binding),
its kernels on the instance's compute stream. Needs a GPU (tests/gpu/conftest.py) and onnxruntime-gpu;
skipped, with the reason, when the installed onnxruntime has no CUDA execution provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip(
        "onnxruntime has no CUDA execution provider (install onnxruntime-gpu)", allow_module_level=True
    )

from tests.onnx_models import WEIGHTS, add_matmul  # noqa: E402
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef  # noqa: E402
from zinfer.client.shm import Segment  # noqa: E402
from zinfer.modelconfig.model_config import ModelConfig  # noqa: E402
from zinfer.modelconfig.repository import load_model_entry  # noqa: E402
from zinfer.modelconfig.signature import Signature  # noqa: E402
from zinfer.workers.batch import BatchRequest, run_batch  # noqa: E402
from zinfer.workers.device import open_device  # noqa: E402
from zinfer.workers.loader import load_model  # noqa: E402
from zinfer.workers.onnx_model import OnnxModel  # noqa: E402
from zinfer.workers.regions import RegionCache  # noqa: E402

CONFIG = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },\n'
    '        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },\n'
    '         { name: "PROJ" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
)


def _load(tmp_path: Path) -> tuple[ModelConfig, Any, Any]:
    """The add_matmul graph as a KIND_GPU onnxruntime model, loaded on GPU 0: (config, device, model)."""
    model_dir = tmp_path / "m"
    add_matmul(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(CONFIG)
    config = load_model_entry(model_dir).config
    assert config is not None
    device = open_device("gpu:0")
    return config, device, load_model(config, model_dir / "1", device)


def test_onnx_on_the_gpu_reads_device_buffers_and_leaves_outputs_there(tmp_path: Path) -> None:
    import cupy as cp

    _, device, model = _load(tmp_path)
    assert isinstance(model, OnnxModel) and model.bound is not None
    assert "CUDAExecutionProvider" in model.session.get_providers()
    rng = np.random.default_rng(5)
    for rows in (1, 7, 64):
        a = rng.standard_normal((rows, 4), dtype=np.float32)
        b = rng.standard_normal((rows, 4), dtype=np.float32)
        # written by a kernel on the compute stream just before the run, without a host wait: ONNX
        # Runtime on another stream could read them before they are there
        da = cp.zeros((rows, 4), cp.float32)
        da += cp.asarray(a)
        out = model.execute({"A": da, "B": cp.asarray(b)})
        assert isinstance(out["SUM"], cp.ndarray) and isinstance(out["PROJ"], cp.ndarray)
        np.testing.assert_allclose(out["SUM"].get(), a + b, rtol=1e-6)
        np.testing.assert_allclose(out["PROJ"].get(), a @ WEIGHTS, rtol=1e-4, atol=1e-5)
    model.finalize()
    device.close()  # type: ignore[attr-defined]


def test_a_batch_of_region_requests_through_the_batch_runner(tmp_path: Path) -> None:
    config, device, model = _load(tmp_path)
    seg, regions = Segment.create(1 << 20), RegionCache(device)
    try:
        a = np.arange(48, dtype=np.float32).reshape(12, 4)
        np.frombuffer(seg.buf, np.float32, count=a.size)[:] = a.reshape(-1)
        row = 16
        reqs = [
            BatchRequest(
                i,
                (
                    TensorRef("A", "FP32", (4, 4), shm=ShmRef(seg.name, i * 4 * row, 4 * row)),
                    TensorRef("B", "FP32", (4, 4), shm=ShmRef(seg.name, i * 4 * row, 4 * row)),
                ),
                (
                    OutputRequest("SUM", ShmRef(seg.name, (1 << 19) + i * 4 * row, 4 * row)),
                    OutputRequest("PROJ", ShmRef(seg.name, (3 << 18) + i * 4 * 12, 4 * 12)),
                ),
            )
            for i in range(3)
        ]
        out = run_batch(model, Signature.of(config), reqs, [], regions, device)
        assert [r["status"] for r in out.results] == [0, 0, 0], out.results
        got_sum = np.frombuffer(seg.buf, np.float32, count=48, offset=1 << 19).reshape(12, 4)
        got_proj = np.frombuffer(seg.buf, np.float32, count=36, offset=3 << 18).reshape(12, 3)
        np.testing.assert_allclose(got_sum, a + a)
        np.testing.assert_allclose(got_proj, a @ WEIGHTS, rtol=1e-4, atol=1e-4)
    finally:
        regions.close()
        seg.close()
        model.finalize()
        device.close()  # type: ignore[attr-defined]
