"""Built-in kernels (linear, mlp) against NumPy, their load errors, devices and instance placement.

GPU code paths run against ``tests/gpu/fake_cupy.py``, a NumPy-backed stand-in for CuPy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.gpu import fake_cupy
from zinfer.broker.devices import GpuProbe, gpu_ids, probe_gpus
from zinfer.broker.registry import place_instances
from zinfer.client.errors import ConfigError
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchRequest, run_batch
from zinfer.workers.dense import ACTIVATIONS, apply_activation
from zinfer.workers.device import CPU, open_device, parse_device
from zinfer.workers.gpu import GpuDevice
from zinfer.workers.kernels import AddKernel, IdentityKernel
from zinfer.workers.loader import load_model
from zinfer.workers.regions import RegionCache


def _config(
    kernel: str, dtype: str = "TYPE_FP32", n_in: int = 4, n_out: int = 3, params: str = ""
) -> ModelConfig:
    return parse_model_config(
        f'name: "m"\nbackend: "zinfer"\nmax_batch_size: 8\n'
        f'input [ {{ name: "X" data_type: {dtype} dims: [ {n_in} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: {dtype} dims: [ {n_out} ] }} ]\n'
        f'parameters [ {{ key: "kernel" value: {{ string_value: "{kernel}" }} }} {params} ]\n',
        source="test",
        model_name="m",
    )


def _param(key: str, value: str) -> str:
    return f', {{ key: "{key}" value: {{ string_value: "{value}" }} }}'


def _reference(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray | None, str]]) -> np.ndarray:
    h = x.astype(np.float64)
    for w, b, act in layers:
        h = h @ w.astype(np.float64) + (0 if b is None else b)
        h = apply_activation(act, h)
    return h


RNG = np.random.default_rng(3)
W0, B0 = RNG.standard_normal((4, 5)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
W1, B1 = RNG.standard_normal((5, 3)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
X = RNG.standard_normal((6, 4)).astype(np.float32)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_matches_numpy_for_every_activation(tmp_path: Path, activation: str) -> None:
    np.save(tmp_path / "W.npy", W1[:4])
    np.save(tmp_path / "b.npy", B1)
    model = load_model(_config("linear", params=_param("activation", activation)), tmp_path)
    y = model.execute({"X": X})["Y"]  # type: ignore[union-attr]
    np.testing.assert_allclose(y, _reference(X, [(W1[:4], B1, activation)]), rtol=1e-5, atol=1e-5)


def test_linear_reads_an_npz_named_by_the_weights_parameter(tmp_path: Path) -> None:
    np.savez(tmp_path / "layer.npz", W=W1[:4], b=B1)
    model = load_model(_config("linear", params=_param("weights", "layer.npz")), tmp_path)
    y = model.execute({"X": X})["Y"]  # type: ignore[union-attr]
    np.testing.assert_allclose(y, _reference(X, [(W1[:4], B1, "none")]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype, np_dtype, tol", [("TYPE_FP32", np.float32, 1e-5), ("TYPE_FP16", np.float16, 2e-2)]
)
def test_mlp_matches_numpy(tmp_path: Path, dtype: str, np_dtype: Any, tol: float) -> None:
    np.savez(tmp_path / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    model = load_model(_config("mlp", dtype, params=_param("activations", "gelu, none")), tmp_path)
    y = model.execute({"X": X.astype(np_dtype)})["Y"]  # type: ignore[union-attr]
    assert y.dtype == np_dtype and y.shape == (6, 3)
    expected = _reference(X.astype(np_dtype), [(W0, B0, "gelu"), (W1, B1, "none")])
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=tol, atol=tol)


def test_mlp_from_npy_files_defaults_to_relu_between_layers(tmp_path: Path) -> None:
    np.save(tmp_path / "W0.npy", W0)
    np.save(tmp_path / "W1.npy", W1)
    np.save(tmp_path / "b1.npy", B1)  # b0 is optional
    model = load_model(_config("mlp"), tmp_path)
    y = model.execute({"X": X})["Y"]  # type: ignore[union-attr]
    np.testing.assert_allclose(y, _reference(X, [(W0, None, "relu"), (W1, B1, "none")]), rtol=1e-5, atol=1e-5)


def test_mlp_writes_a_lone_request_straight_into_its_slot(tmp_path: Path) -> None:
    np.savez(tmp_path / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    config = _config("mlp")
    model = load_model(config, tmp_path)
    seg, regions = Segment.create(4096), RegionCache()
    try:
        np.frombuffer(seg.buf, np.float32, count=X.size).reshape(X.shape)[:] = X
        req = BatchRequest(
            1,
            (TensorRef("X", "FP32", X.shape, shm=ShmRef(seg.name, 0, X.nbytes)),),
            (OutputRequest("Y", ShmRef(seg.name, 1024, 6 * 3 * 4)),),
        )
        out = run_batch(model, Signature.of(config), [req], [], regions)
        assert out.results[0].outputs[0].shm == (seg.name, 1024, 72) and out.frames == []
        got = np.frombuffer(seg.buf, np.float32, count=18, offset=1024).reshape(6, 3)
        np.testing.assert_allclose(
            got, _reference(X, [(W0, B0, "relu"), (W1, B1, "none")]), rtol=1e-5, atol=1e-5
        )
        del got
    finally:
        regions.close()
        seg.close()


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    "kernel, setup, params, message",
    [
        ("linear", lambda d: None, "", "W.npy not found"),
        ("mlp", lambda d: None, "", "weights.npz not found"),
        ("mlp", lambda d: _write(d / "weights.npz", b"not a zip"), "", "weights.npz: cannot read weights"),
        ("mlp", lambda d: np.savez(d / "weights.npz", W0=W0, W2=W1), "", "found W0, W2"),
        ("mlp", lambda d: np.savez(d / "weights.npz", W0=W0, W1=W0), "", "W1 takes 4 features"),
        ("mlp", lambda d: np.savez(d / "weights.npz", W0=W0, b0=B1, W1=W1), "", "b0 must be [5]"),
        (
            "mlp",
            lambda d: np.savez(d / "weights.npz", W0=W0, W1=W1),
            _param("activations", "relu"),
            "lists 1",
        ),
        (
            "mlp",
            lambda d: np.savez(d / "weights.npz", W0=W0, W1=W1),
            _param("activations", "relu,swish"),
            "swish",
        ),
        ("mlp", lambda d: np.savez(d / "weights.npz", W0=W1), "", "input dims [4] must end in 5"),
        ("mlp", lambda d: np.savez(d / "weights.npz", W0=W0), "", "output dims [3] must end in 5"),
        (
            "linear",
            lambda d: np.save(d / "W.npy", np.zeros(4, np.float32)),
            "",
            "must be a 2-D numeric array",
        ),
    ],
)
def test_weight_problems_fail_the_load_naming_the_file(
    tmp_path: Path, kernel: str, setup: Any, params: str, message: str
) -> None:
    setup(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_model(_config(kernel, params=params), tmp_path)
    assert message in str(info.value)
    if "activations" not in params:
        assert str(tmp_path) in str(info.value)


def test_dense_kernels_need_a_float_output(tmp_path: Path) -> None:
    np.save(tmp_path / "W.npy", W1[:4])
    with pytest.raises(ConfigError, match="floating-point output"):
        load_model(_config("linear", "TYPE_INT32"), tmp_path)


def test_unknown_kernel_and_backend_are_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parameter 'kernel' must be one of"):
        load_model(_config("conv"), tmp_path)
    config = parse_model_config('name: "m"\nbackend: "tensorrt"\n', source="t", model_name="m")
    with pytest.raises(ConfigError, match="backend 'tensorrt' is not supported by zinfer"):
        load_model(config, tmp_path)
    config = parse_model_config('name: "m"\nbackend: "onnxruntime"\n', source="t", model_name="m")
    with pytest.raises(ConfigError, match="needs .*model.onnx: not found"):  # known backend, no graph file
        load_model(config, tmp_path)


# ------------------------------------------------------------------------------------------ devices


def test_device_specs() -> None:
    assert parse_device("cpu") is None
    assert parse_device("gpu:3") == 3
    for bad in ("gpu", "gpu:x", "tpu:0", "gpu:-1"):
        with pytest.raises(ConfigError):
            parse_device(bad)
    assert open_device("cpu") is CPU


def test_gpu_device_without_cupy_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(ConfigError, match=r"gpu:0: CuPy cannot be imported.*zinfer\[gpu-cuda12\]"):
        open_device("gpu:0")


def test_gpu_device_selects_its_gpu_and_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupy.install(monkeypatch, device_count=2)
    device = open_device("gpu:1")
    assert isinstance(device, GpuDevice) and device.spec == "gpu:1" and device.kind == "GPU"
    assert fake_cupy.calls("device") == [1] and fake_cupy.current() is device.stream  # pushed, current
    with pytest.raises(ConfigError, match="only 2 GPU"):
        open_device("gpu:2")


@pytest.mark.parametrize(
    "dtype, np_dtype, tol", [("TYPE_FP32", np.float32, 1e-5), ("TYPE_FP16", np.float16, 3e-2)]
)
def test_mlp_on_a_gpu_device_computes_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dtype: str, np_dtype: Any, tol: float
) -> None:
    cupy = fake_cupy.install(monkeypatch)
    np.savez(tmp_path / "weights.npz", W0=W0, b0=B0, W1=W1, b1=B1)
    device = open_device("gpu:0")
    model = load_model(_config("mlp", dtype), tmp_path, device)
    assert not model.writes_into_slots
    assert all(isinstance(layer.w, cupy.ndarray) and layer.w.dtype == np_dtype for layer in model.layers)  # type: ignore[union-attr]
    y = model.execute({"X": cupy.asarray(X.astype(np_dtype))})["Y"]  # type: ignore[union-attr]
    assert isinstance(y, cupy.ndarray) and y.dtype == np_dtype
    expected = _reference(X.astype(np_dtype), [(W0, B0, "relu"), (W1, B1, "none")])
    np.testing.assert_allclose(y.get().astype(np.float64), expected, rtol=tol, atol=tol)


def test_gpu_batch_copies_rows_in_and_slots_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cupy.install(monkeypatch)
    np.save(tmp_path / "W.npy", W1[:4])
    config = _config("linear")
    device = open_device("gpu:0")
    model = load_model(config, tmp_path, device)
    seg, regions = Segment.create(8192), RegionCache(device)
    try:
        host = np.frombuffer(seg.buf, np.float32, count=X.size).reshape(X.shape)
        host[:] = X
        slot = ShmRef(seg.name, 4096, 2 * 3 * 4)
        reqs = [
            BatchRequest(
                1, (TensorRef("X", "FP32", (2, 4), shm=ShmRef(seg.name, 0, 32)),), (OutputRequest("Y", slot),)
            ),
            BatchRequest(2, (TensorRef("X", "FP32", (4, 4), frame=0),), (OutputRequest("Y"),)),
        ]
        out = run_batch(model, Signature.of(config), reqs, [X[2:].tobytes()], regions, device)
        assert [r.status for r in out.results] == [0, 0], out.results
        assert fake_cupy.calls("set") == [
            (2, 4),
            (4, 4),
        ]  # each request's rows straight into the batch buffer
        assert fake_cupy.calls("get") == [False]  # the slot: an async D2H, waited for before the reply
        assert fake_cupy.calls("sync")
        assert fake_cupy.calls("register") == [8192]  # the region was page-locked when first mapped
        expected = X @ W1[:4]
        got = np.frombuffer(seg.buf, np.float32, count=6, offset=4096).reshape(2, 3)
        np.testing.assert_allclose(got, expected[:2], rtol=1e-5)
        frame = out.results[1].outputs[0].frame
        np.testing.assert_allclose(
            np.frombuffer(out.frames[frame], np.float32).reshape(4, 3), expected[2:], rtol=1e-5
        )
        del host, got
    finally:
        regions.close()
        seg.close()
    assert len(fake_cupy.calls("unregister")) == 1  # and unregistered before it was unmapped


def test_add_and_identity_on_a_gpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = fake_cupy.install(monkeypatch)
    config = parse_model_config(
        'name: "m"\nbackend: "zinfer"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] },\n'
        '        { name: "B" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'output [ { name: "S" data_type: TYPE_INT32 dims: [ 2 ] },\n'
        '         { name: "D" data_type: TYPE_INT32 dims: [ 2 ] } ]\n',
        source="t",
        model_name="m",
    )
    device = open_device("gpu:0")
    a, b = cupy.asarray(np.array([[5, 7]], np.int32)), cupy.asarray(np.array([[1, 2]], np.int32))
    out = AddKernel(config, None, device).execute({"A": a, "B": b})
    assert isinstance(out["S"], cupy.ndarray)
    assert out["S"].get().tolist() == [[6, 9]] and out["D"].get().tolist() == [[4, 5]]
    same = IdentityKernel(config, None, device).execute({"A": a, "B": b})
    assert same["S"] is a


# ---------------------------------------------------------------------------------------- placement


def _groups(groups: str) -> ModelConfig:
    return parse_model_config(
        f'name: "m"\nbackend: "zinfer"\ninstance_group [ {groups} ]\n', source="t", model_name="m"
    )


TWO_GPUS = GpuProbe((0, 1), ("H200", "H200"))
NO_GPU = GpuProbe((), reason="CuPy is not installed")


@pytest.mark.parametrize(
    "groups, probe, expected",
    [
        ("{ kind: KIND_GPU count: 2 }", TWO_GPUS, ["gpu:0", "gpu:0", "gpu:1", "gpu:1"]),
        ("{ kind: KIND_GPU gpus: [ 1 ] }", TWO_GPUS, ["gpu:1"]),
        ("{ kind: KIND_CPU count: 3 }", TWO_GPUS, ["cpu", "cpu", "cpu"]),
        ("{ kind: KIND_MODEL }", TWO_GPUS, ["cpu"]),
        ("{ kind: KIND_AUTO }", TWO_GPUS, ["gpu:0", "gpu:1"]),
        ("{ kind: KIND_AUTO count: 2 }", NO_GPU, ["cpu", "cpu"]),
        ("{ kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0 ] }", TWO_GPUS, ["cpu", "gpu:0"]),
        ("{ kind: KIND_GPU }", NO_GPU, "KIND_GPU but no usable GPU: CuPy is not installed"),
        ("{ kind: KIND_GPU gpus: [ 0, 2 ] }", TWO_GPUS, "gpus [2] not usable (usable GPUs: [0, 1])"),
        ("{ kind: KIND_AUTO gpus: [ 0 ] }", NO_GPU, "no usable GPU"),
    ],
)
def test_place_instances(groups: str, probe: GpuProbe, expected: list[str] | str) -> None:
    placed = place_instances(_groups(groups), probe)
    if isinstance(expected, str):
        assert isinstance(placed, str) and expected in placed
    else:
        assert placed == expected


def test_gpu_probe_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    probe = probe_gpus()
    assert probe.ids == () and "CUDA_VISIBLE_DEVICES" in probe.reason


def test_gpu_probe_without_cupy_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert "CuPy is not installed" in probe_gpus().reason


def test_gpu_probe_reports_a_failing_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import zinfer.broker.devices as devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    monkeypatch.setattr(devices, "_PROBE", "raise SystemExit('cudaErrorNoDevice: no CUDA-capable device')")
    probe = devices.probe_gpus(timeout=20)
    assert probe.ids == () and "cudaErrorNoDevice" in probe.reason
    monkeypatch.setattr(devices, "_PROBE", 'print(\'{"count": 2, "names": ["a", "b"]}\')')
    assert devices.probe_gpus(timeout=20) == GpuProbe((0, 1), ("a", "b"))


def test_gpu_ids_is_a_list() -> None:
    ids = gpu_ids()
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
