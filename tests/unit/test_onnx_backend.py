"""The ONNX Runtime backend without a server: the graph reader, Triton's auto-complete, the load checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.onnx_models import ADD_MATMUL_CONFIG as FULL  # noqa: E402
from tests.onnx_models import WEIGHTS, add_matmul, int_identity, simple_string, string_identity  # noqa: E402
from zinfer.client.errors import ConfigError, InvalidArgument  # noqa: E402
from zinfer.modelconfig.autocomplete import DEFAULT_MAX_BATCH_SIZE, complete_onnx_config  # noqa: E402
from zinfer.modelconfig.model_config import parse_model_config  # noqa: E402
from zinfer.modelconfig.onnx_graph import read_onnx_graph  # noqa: E402
from zinfer.modelconfig.repository import load_model_entry  # noqa: E402
from zinfer.workers.loader import load_model  # noqa: E402
from zinfer.workers.onnx_model import OnnxModel  # noqa: E402


def _config(text: str, name: str = "m"):  # type: ignore[no-untyped-def]
    return parse_model_config(text, source="config.pbtxt", model_name=name)


def _repo_model(tmp_path: Path, config: str, build=add_matmul, filename: str = "model.onnx") -> Path:  # type: ignore[no-untyped-def]
    model_dir = tmp_path / "m"
    build(model_dir / "1" / filename)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def test_graph_reader_skips_initializers_listed_as_inputs(tmp_path: Path) -> None:
    old = read_onnx_graph(add_matmul(tmp_path / "ir3.onnx", ir_version=3))
    new = read_onnx_graph(add_matmul(tmp_path / "ir8.onnx"))
    assert old == new
    assert [(t.name, t.data_type, t.dims) for t in new.inputs] == [
        ("A", "TYPE_FP32", (None, 4)),
        ("B", "TYPE_FP32", (None, 4)),
    ]
    assert [(t.name, t.dims) for t in new.outputs] == [("SUM", (None, 4)), ("PROJ", (None, 3))]


def test_graph_reader_refuses_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\xff\xff\xff\xff not protobuf")
    with pytest.raises(ConfigError, match="not a valid ONNX model"):
        read_onnx_graph(bad)
    bad.write_bytes(b"")
    with pytest.raises(ConfigError, match="empty file"):
        read_onnx_graph(bad)


def test_auto_complete_a_batching_graph(tmp_path: Path) -> None:
    graph = read_onnx_graph(add_matmul(tmp_path / "model.onnx"))
    done = complete_onnx_config(_config('platform: "onnxruntime_onnx"'), graph)
    assert done.max_batch_size == DEFAULT_MAX_BATCH_SIZE == 4  # Triton's default-max-batch-size
    assert [(t.name, t.data_type, t.dims) for t in done.input] == [
        ("A", "TYPE_FP32", (4,)),
        ("B", "TYPE_FP32", (4,)),
    ]
    assert [(t.name, t.dims) for t in done.output] == [("SUM", (4,)), ("PROJ", (3,))]
    assert done.dynamic_batching is not None and done.dynamic_batching.preferred_batch_size == (4,)


def test_auto_complete_keeps_what_the_config_gives(tmp_path: Path) -> None:
    graph = read_onnx_graph(add_matmul(tmp_path / "model.onnx"))
    text = (
        'backend: "onnxruntime"\nmax_batch_size: 16\n'
        'output [ { name: "PROJ" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "sequence_batching { }\n"
    )
    done = complete_onnx_config(_config(text), graph)
    assert done.max_batch_size == 16
    assert [t.name for t in done.input] == ["A", "B"]
    assert [t.name for t in done.output] == ["PROJ"]  # the config's subset stays
    assert done.dynamic_batching is None  # a scheduler was given


def test_auto_complete_without_a_batch_dim(tmp_path: Path) -> None:
    graph = read_onnx_graph(int_identity(tmp_path / "model.onnx"))
    done = complete_onnx_config(_config('platform: "onnxruntime_onnx"'), graph)
    assert done.max_batch_size == 0 and done.dynamic_batching is None
    assert [(t.name, t.data_type, t.dims) for t in done.input] == [("IN", "TYPE_INT64", (2, 3))]
    # inputs listed at full rank with max_batch_size 0: the leading dim is theirs, not a batch dim
    full = _config(
        'platform: "onnxruntime_onnx"\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]'
    )
    done = complete_onnx_config(full, read_onnx_graph(add_matmul(tmp_path / "b.onnx")))
    assert done.max_batch_size == 0
    assert [(t.name, t.dims) for t in done.output] == [("SUM", (-1, 4)), ("PROJ", (-1, 3))]


def test_repository_entry_is_completed_from_default_model_filename(tmp_path: Path) -> None:
    model_dir = _repo_model(
        tmp_path, 'platform: "onnxruntime_onnx"\ndefault_model_filename: "net.onnx"\n', filename="net.onnx"
    )
    entry = load_model_entry(model_dir)
    assert entry.error is None, entry.error
    assert entry.config is not None and entry.config.max_batch_size == 4
    assert [t.name for t in entry.config.input] == ["A", "B"]
    (model_dir / "1" / "net.onnx").rename(model_dir / "1" / "model.onnx")
    entry = load_model_entry(model_dir)
    assert entry.error is not None and "net.onnx: not found" in entry.error


@pytest.mark.parametrize("ir_version", [3, 8])
def test_load_runs_the_whole_batch(tmp_path: Path, ir_version: int) -> None:
    model_dir = tmp_path / "m"
    add_matmul(model_dir / "1" / "model.onnx", ir_version=ir_version)
    (model_dir / "config.pbtxt").write_text(FULL)
    model = load_model(load_model_entry(model_dir).config, model_dir / "1")  # type: ignore[arg-type]
    assert isinstance(model, OnnxModel)
    a = np.arange(20, dtype=np.float32).reshape(5, 4)
    b = np.full((5, 4), 0.25, np.float32)
    out = model.execute({"A": a, "B": b})
    assert np.array_equal(out["SUM"], a + b) and np.array_equal(out["PROJ"], a @ WEIGHTS)
    model.finalize()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c.replace('name: "A" data_type: TYPE_FP32', 'name: "A" data_type: TYPE_FP64'),
            "input 'A' is TYPE_FP64 in config.pbtxt but TYPE_FP32 in the graph",
        ),
        (
            lambda c: c.replace(
                '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }',
                '{ name: "C" data_type: TYPE_FP32 dims: [ 4 ] }',
            ),
            "input 'C' is not an input of the graph",
        ),
        (
            lambda c: c.replace("dims: [ 3 ]", "dims: [ 5 ]"),
            r"output 'PROJ' has shape \[-1, 5\] in config.pbtxt but \[-1, 3\] in the graph",
        ),
        (lambda c: c.replace('name: "PROJ"', 'name: "NOPE"'), "output 'NOPE' is not an output of the graph"),
        (
            lambda c: c.replace("max_batch_size: 8", "max_batch_size: 0"),
            r"input 'A' has shape \[4\] in config.pbtxt but rank 2",
        ),
    ],
)
def test_load_refuses_a_config_that_does_not_match_the_graph(
    tmp_path: Path, change: Callable[[str], str], message: str
) -> None:
    text = change(FULL)
    assert text != FULL
    model_dir = _repo_model(tmp_path, text)
    config = _config(text)
    with pytest.raises(ConfigError, match=message):
        load_model(config, model_dir / "1")


def test_load_refuses_a_missing_graph_input_and_a_fixed_batch_dim(tmp_path: Path) -> None:
    text = FULL.replace(',\n        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', "")
    assert text.count('"B"') == 0
    model_dir = _repo_model(tmp_path, text)
    with pytest.raises(ConfigError, match="the graph needs input"):
        load_model(_config(text), model_dir / "1")
    ident = 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    ident += 'input [ { name: "IN" data_type: TYPE_INT64 dims: [ 3 ] } ]\n'
    ident += 'output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 3 ] } ]\n'
    model_dir = _repo_model(tmp_path / "i", ident, build=int_identity)
    with pytest.raises(ConfigError, match="the graph fixes the leading dim to 2"):
        load_model(_config(ident), model_dir / "1")


def test_kind_gpu_is_refused_without_the_cuda_provider(tmp_path: Path) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")

    class FakeGpu:
        kind = "GPU"
        id = 0

    model_dir = _repo_model(tmp_path, FULL)
    with pytest.raises(ConfigError, match="KIND_GPU instance of an onnxruntime model needs onnxruntime-gpu"):
        load_model(_config(FULL), model_dir / "1", FakeGpu())  # type: ignore[arg-type]


def test_a_model_file_onnx_runtime_cannot_load(tmp_path: Path) -> None:
    model_dir = _repo_model(tmp_path, FULL)
    (model_dir / "1" / "model.onnx").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="ONNX Runtime cannot load it"):
        load_model(_config(FULL), model_dir / "1")


def test_auto_complete_normalises_the_configs_dynamic_batching(tmp_path: Path) -> None:
    graph = read_onnx_graph(add_matmul(tmp_path / "model.onnx"))
    text = 'platform: "onnxruntime_onnx"\ndynamic_batching { max_queue_delay_microseconds: 100 }'
    done = complete_onnx_config(_config(text), graph)
    assert done.max_batch_size == 4 and done.dynamic_batching is not None
    assert done.dynamic_batching.preferred_batch_size == (4,)
    assert done.dynamic_batching.max_queue_delay_microseconds == 100


def test_string_tensors_go_through_onnx_runtime_as_text(tmp_path: Path) -> None:
    model_dir = _repo_model(tmp_path, 'platform: "onnxruntime_onnx"\n', build=string_identity)
    config = load_model_entry(model_dir).config
    assert config is not None and config.max_batch_size == 4
    assert [(t.name, t.data_type, t.dims) for t in config.input] == [("TEXT", "TYPE_STRING", (-1,))]
    model = load_model(config, model_dir / "1")
    rows = [[b"caf\xc3\xa9", b"", b"a\x00b"], [b"x" * 1000, b"1", "\u00e9t\u00e9".encode()]]
    text = np.array(rows, dtype=object)
    out = model.execute({"TEXT": text})["OUT"]
    assert out.shape == (2, 3) and out.dtype == object
    assert [s.encode() for s in out.reshape(-1)] == list(text.reshape(-1))  # UTF-8 back, byte for byte
    with pytest.raises(InvalidArgument, match=r"input 'TEXT': element 1 of the batch is not UTF-8"):
        model.execute({"TEXT": np.array([[b"ok", b"\xff\xfe", b"ok"]], dtype=object)})
    model.finalize()


def test_string_arithmetic_through_cast(tmp_path: Path) -> None:
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    model_dir = _repo_model(tmp_path, text, build=simple_string)
    config = load_model_entry(model_dir).config
    assert config is not None
    model = load_model(config, model_dir / "1")
    a = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    b = np.array([[b"1"] * 16], dtype=object)
    out = model.execute({"INPUT0": a, "INPUT1": b})
    assert [int(v) for v in out["OUTPUT0"].reshape(-1)] == [i + 1 for i in range(16)]
    assert [int(v) for v in out["OUTPUT1"].reshape(-1)] == [i - 1 for i in range(16)]
    model.finalize()
