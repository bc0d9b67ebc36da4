"""ONNX Runtime I/O binding (``zinfer.workers.onnx_binding``), the KIND_GPU path's way of running a session
on the worker's device buffers, driven here through real ONNX Runtime sessions bound to host memory by
address (``host_place``): the same binding calls a GPU worker makes with ``("cuda", ordinal)``.

The GPU half (CuPy arrays bound by device pointer, outputs viewed in place, the compute stream as ONNX
Runtime's stream) runs in tests/gpu/test_onnx_gpu.py where a GPU and onnxruntime-gpu are present."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tests.onnx_models import ADD_MATMUL_CONFIG as FULL  # noqa: E402
from tests.onnx_models import WEIGHTS, add_matmul, string_identity  # noqa: E402
from zinfer.modelconfig.model_config import parse_model_config  # noqa: E402
from zinfer.modelconfig.onnx_options import OnnxSessionOptions  # noqa: E402
from zinfer.modelconfig.repository import load_model_entry  # noqa: E402
from zinfer.workers import onnx_model  # noqa: E402
from zinfer.workers.device import CpuDevice  # noqa: E402
from zinfer.workers.onnx_binding import BoundRun, host_place  # noqa: E402


class _GpuLike(CpuDevice):
    """A device that says it is not the host (so OnnxModel takes its KIND_GPU route) with host arrays."""

    spec = "gpu:3"
    kind = "GPU"
    id = 3
    is_host = False
    ordinal = 0
    stream = SimpleNamespace(ptr=0x7F00)


def _session(path: Path) -> Any:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_bound_inputs_and_outputs_give_what_session_run_gives(tmp_path: Path) -> None:
    session = _session(add_matmul(tmp_path / "m.onnx"))
    bound = BoundRun(session, ["SUM", "PROJ"], frozenset({"SUM", "PROJ"}), host_place())
    rng = np.random.default_rng(3)
    for rows in (1, 5, 64):  # a new shape each time: every binding is made for its own batch
        a = rng.standard_normal((rows, 4), dtype=np.float32)
        b = rng.standard_normal((rows, 4), dtype=np.float32)
        got = bound.run({"A": a, "B": b})
        assert list(got) == ["SUM", "PROJ"]
        assert np.array_equal(got["SUM"], a + b)
        assert np.allclose(got["PROJ"], a @ WEIGHTS, rtol=1e-5, atol=1e-6)
        assert got["SUM"].shape == (rows, 4) and got["PROJ"].shape == (rows, 3)


def test_a_strided_input_is_bound_as_its_values_not_its_buffer(tmp_path: Path) -> None:
    session = _session(add_matmul(tmp_path / "m.onnx"))
    bound = BoundRun(session, ["SUM", "PROJ"], frozenset({"SUM", "PROJ"}), host_place())
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    a = base[::2, ::2]  # a view: its address alone would read the wrong elements
    b = np.ones((4, 4), np.float32).T  # Fortran order
    got = bound.run({"A": a, "B": b})
    assert not a.flags.c_contiguous
    assert np.array_equal(got["SUM"], a + b)
    assert np.allclose(got["PROJ"], a @ WEIGHTS)


def _cast_to_text(path: Path) -> Path:
    """Y = Cast(X, to=STRING) for int32 X of shape [N]: a string output of a bindable model."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.STRING)],
        "cast_to_text",
        [helper.make_tensor_value_info("X", TensorProto.INT32, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_string_output_is_bound_to_the_host(tmp_path: Path) -> None:
    session = _session(_cast_to_text(tmp_path / "c.onnx"))
    bound = BoundRun(session, ["Y"], frozenset(), host_place())  # TYPE_STRING is never a device output
    got = bound.run({"X": np.array([1, 22, -3], np.int32)})
    assert got["Y"].tolist() == ["1", "22", "-3"]


def test_string_inputs_cannot_be_bound_so_such_a_model_takes_the_host_route(tmp_path: Path) -> None:
    session = _session(string_identity(tmp_path / "s.onnx"))
    with pytest.raises(RuntimeError, match="non-string"):  # why OnnxModel does not bind them
        BoundRun(session, ["OUT"], frozenset(), host_place()).run({"TEXT": np.array([["a"]], dtype=object)})
    config = parse_model_config(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]\n',
        source="config.pbtxt",
        model_name="s",
    )
    model = onnx_model.OnnxModel(session, config, _GpuLike())
    assert model.bound is None
    out = model.execute({"TEXT": np.array([[b"ab", "d\u00e9f".encode()]], dtype=object)})
    assert out["OUT"].tolist() == [["ab", "d\u00e9f"]]


def test_a_binding_survives_its_inputs_being_rewritten_after_the_run(tmp_path: Path) -> None:
    """The outputs are ONNX Runtime's own buffers, not views of the inputs: rewriting the batch's input
    buffer afterwards (the next batch's copy into it) leaves the answer as it was."""
    session = _session(add_matmul(tmp_path / "m.onnx"))
    bound = BoundRun(session, ["SUM", "PROJ"], frozenset({"SUM", "PROJ"}), host_place())
    a = np.full((3, 4), 2.0, np.float32)
    b = np.full((3, 4), 3.0, np.float32)
    got = bound.run({"A": a, "B": b})
    a[:] = 100.0
    assert np.array_equal(got["SUM"], np.full((3, 4), 5.0, np.float32))


def test_the_gpu_route_runs_through_the_binding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "m"
    add_matmul(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(FULL)
    config = load_model_entry(model_dir).config
    assert config is not None
    places: list[tuple[Any, int]] = []

    def place(xp: Any, ordinal: int) -> Any:
        places.append((xp, ordinal))
        return host_place()

    runs: list[dict[str, Any]] = []
    real_run = BoundRun.run

    def counted(self: BoundRun, feed: Any) -> dict[str, Any]:
        runs.append(dict(feed))
        return real_run(self, feed)

    monkeypatch.setattr(onnx_model, "cupy_place", place)
    monkeypatch.setattr(BoundRun, "run", counted)
    session = _session(model_dir / "1" / "model.onnx")
    model = onnx_model.OnnxModel(session, config, _GpuLike())
    assert places == [(np, 0)]  # the in-process CUDA device number, not the server's GPU 3
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = model.execute({"A": a, "B": a})
    assert len(runs) == 1 and np.array_equal(out["SUM"], a + a)
    assert model.bound is not None and model.bound.device_outputs == frozenset({"SUM", "PROJ"})


def test_cuda_provider_gets_the_process_ordinal_and_the_compute_stream() -> None:
    config = parse_model_config(FULL, source="config.pbtxt", model_name="m")
    fake_ort = SimpleNamespace(
        get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    options = OnnxSessionOptions(cuda_provider_options={"cudnn_conv_algo_search": "HEURISTIC"})
    providers = onnx_model._providers(fake_ort, config, _GpuLike(), options)
    assert providers == [
        (
            "CUDAExecutionProvider",
            {
                "device_id": "0",
                "cudnn_conv_algo_search": "HEURISTIC",
                "has_user_compute_stream": "1",
                "user_compute_stream": str(0x7F00),
            },
        )
    ]
    assert onnx_model._providers(fake_ort, config, CpuDevice(), options) == ["CPUExecutionProvider"]
