"""ONNX Runtime options from config.pbtxt, as Triton's onnxruntime backend reads them: checked without
onnxruntime (``zinfer.modelconfig.onnx_options``), applied to the session the worker loads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tests.onnx_models import add_matmul  # noqa: E402
from zinfer.client.errors import ConfigError  # noqa: E402
from zinfer.modelconfig.model_config import parse_model_config  # noqa: E402
from zinfer.modelconfig.onnx_options import OnnxSessionOptions, onnx_session_options  # noqa: E402
from zinfer.modelconfig.repository import load_model_entry  # noqa: E402
from zinfer.workers.loader import load_model  # noqa: E402
from zinfer.workers.onnx_model import OnnxModel  # noqa: E402

HEAD = 'platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_CPU } ]\n'


def _params(**values: str) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def _options(text: str) -> OnnxSessionOptions:
    return onnx_session_options(parse_model_config(HEAD + text, source="config.pbtxt", model_name="m"))


def _entry_error(tmp_path: Path, text: str) -> str | None:
    model_dir = tmp_path / "m"
    add_matmul(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(HEAD + text)
    return load_model_entry(model_dir).error


def test_defaults_are_onnx_runtimes() -> None:
    assert _options("") == OnnxSessionOptions()
    assert _options("optimization { graph { level: 0 } }").graph_optimization_level == "ORT_ENABLE_ALL"


@pytest.mark.parametrize(
    ("level", "ort_level"), [(-1, "ORT_ENABLE_BASIC"), (1, "ORT_ENABLE_EXTENDED"), (2, "ORT_DISABLE_ALL")]
)
def test_graph_levels_map_as_in_triton(level: int, ort_level: str) -> None:
    assert _options(f"optimization {{ graph {{ level: {level} }} }}").graph_optimization_level == ort_level


def test_every_documented_parameter_is_read() -> None:
    got = _options(
        _params(
            intra_op_thread_count="3",
            inter_op_thread_count="2",
            execution_mode="1",
            enable_mem_arena="true",
            enable_mem_pattern="0",
            **{"session.use_device_allocator_for_initializers": "1"},
            **{"memory.enable_memory_arena_shrinkage": "cpu:0;gpu:1"},
            share_session_between_instances="true",
            cudnn_conv_algo_search="1",
            gpu_mem_limit="4294967200",
            arena_extend_strategy="1",
            do_copy_in_default_stream="0",
            some_other_key="left alone, as Triton leaves it",
        )
    )
    assert (got.intra_op_num_threads, got.inter_op_num_threads, got.execution_mode) == (3, 2, "ORT_PARALLEL")
    assert got.enable_cpu_mem_arena is True and got.enable_mem_pattern is False
    assert dict(got.session_config) == {"session.use_device_allocator_for_initializers": "1"}
    assert got.shrinkage_for(on_gpu=False) == "cpu:0" and got.shrinkage_for(on_gpu=True) == "cpu:0;gpu:1"
    assert dict(got.cuda_provider_options) == {
        "cudnn_conv_algo_search": "HEURISTIC",
        "gpu_mem_limit": "4294967200",
        "arena_extend_strategy": "kSameAsRequested",
        "do_copy_in_default_stream": "0",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optimization { graph { level: 3 } }", "optimization.graph.level 3 is not one Triton's onnxruntime"),
        (_params(intra_op_thread_count="-1"), "parameter intra_op_thread_count must be a whole number >= 0"),
        (_params(inter_op_thread_count="two"), "parameter inter_op_thread_count must be a whole number"),
        (_params(execution_mode="2"), "parameter execution_mode must be one of 0, 1, got '2'"),
        (_params(enable_mem_arena="maybe"), "parameter enable_mem_arena must be 1 or 0"),
        (_params(enable_mem_pattern=""), "parameter enable_mem_pattern must be 1 or 0"),
        (_params(**{"memory.enable_memory_arena_shrinkage": "tpu:0"}), "must list devices as cpu:0 or gpu"),
        (_params(**{"memory.enable_memory_arena_shrinkage": "cpu:1"}), "the CPU is cpu:0, got 'cpu:1'"),
        (
            _params(enable_mem_arena="0", **{"memory.enable_memory_arena_shrinkage": "cpu:0"}),
            "names cpu:0, but enable_mem_arena is off",
        ),
        (_params(cudnn_conv_algo_search="9"), "parameter cudnn_conv_algo_search must be one of 0, 1, 2"),
        (_params(gpu_mem_limit="1GB"), "parameter gpu_mem_limit must be a whole number"),
        (
            'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }',
            r"optimization.execution_accelerators \(gpu_execution_accelerator 'tensorrt'\) is not supported",
        ),
        (
            'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }',
            "cpu_execution_accelerator 'openvino'",
        ),
    ],
)
def test_bad_values_fail_the_load_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _options(text)
    # the broker refuses the model at load with the same reason (before any worker starts)
    error = _entry_error(tmp_path, text)
    assert error is not None and "not supported yet" not in error
    assert re.search(message, error)


def test_graph_level_is_an_onnx_models_own(tmp_path: Path) -> None:
    assert _entry_error(tmp_path, "optimization { graph { level: 1 } }") is None
    # other optimization fields stay unsupported, as for every model
    error = _entry_error(tmp_path, "optimization { eager_batching: true }")
    assert error is not None and "not supported yet: optimization" in error
    python = parse_model_config(
        'backend: "python"\noptimization { graph { level: 1 } }', source="config.pbtxt", model_name="p"
    )
    from zinfer.modelconfig.features import unsupported_features

    assert "optimization" in unsupported_features(python)


def test_the_options_reach_the_session(tmp_path: Path) -> None:
    text = "optimization { graph { level: 2 } }\n" + _params(
        intra_op_thread_count="1",
        inter_op_thread_count="2",
        execution_mode="1",
        enable_mem_arena="1",
        enable_mem_pattern="0",
        **{"session.use_device_allocator_for_initializers": "1"},
        **{"memory.enable_memory_arena_shrinkage": "cpu:0;gpu:0"},
    )
    model_dir = tmp_path / "m"
    add_matmul(model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(HEAD + text)
    entry = load_model_entry(model_dir)
    assert entry.error is None and entry.config is not None
    model = load_model(entry.config, model_dir / "1")
    assert isinstance(model, OnnxModel)
    so = model.session.get_session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (1, 2)
    assert so.enable_cpu_mem_arena is True and so.enable_mem_pattern is False
    assert so.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"
    # a CPU instance keeps only the cpu entry (ONNX Runtime refuses every run that names an absent GPU)
    assert model.run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    a = np.ones((2, 4), np.float32)
    assert np.array_equal(model.execute({"A": a, "B": a})["SUM"], a + a)
    model.finalize()
