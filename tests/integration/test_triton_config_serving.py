"""Triton config points served end to end (issue 16): outputs without a batch dim of one row, optional
inputs, model_warmup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, wait_for
from zinfer.client import Client
from zinfer.client.errors import ServerError

pytestmark = pytest.mark.integration


def _model(repo: Path, name: str, config: str, code: str) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").write_text(code)


UNBATCHED_OUTPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            # like Triton's qa sequence_py: shape [1] for dims [ 1 ], the batch dim of one row left out
            y = np.array([x.sum() + 1], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y)]))
        return out
"""

OPTIONAL_INPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            extra = 100 if b is None else int(b.as_numpy().sum())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (a + extra).astype(np.int32))]))
        return out
"""


def test_an_output_without_the_batch_dim_of_one_row(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    config = (
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    _model(tmp_path / "repo", "seq_like", config, UNBATCHED_OUTPUT)
    server = server_factory(tmp_path / "repo")
    with Client(server.url, timeout=30) as client:
        out = client.infer("seq_like", {"IN": np.array([[41]], np.int32)}).as_numpy("OUT")
        assert out.shape == (1,) and out[0] == 42  # passed on as the model gave it, as Triton does
        # two rows and one output row: passed on as the model made it too (Triton does; issue 32), logged once
        out = client.infer("seq_like", {"IN": np.array([[1], [2]], np.int32)}).as_numpy("OUT")
        assert out.shape == (1,) and out[0] == 4
    logged = lambda: server.log().count("event=output_unlike_config") == 1  # noqa: E731
    wait_for(logged, 10, "one line for the model's output")


def test_an_optional_input_may_be_left_out(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    config = (
        'backend: "python"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '        { name: "B" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    _model(tmp_path / "repo", "opt", config, OPTIONAL_INPUT)
    server = server_factory(tmp_path / "repo")
    one = np.array([[1]], np.int32)
    with Client(server.url, timeout=30) as client:
        assert client.infer("opt", {"A": one}).as_numpy("Y")[0, 0] == 101  # the model saw B absent
        assert client.infer("opt", {"A": one, "B": 2 * one}).as_numpy("Y")[0, 0] == 3
        with pytest.raises(ServerError, match=r"missing required input\(s\) \['A'\]"):
            client.infer("opt", {"B": one})
        assert client.model_config("opt")["input"][1]["optional"] is True


WARMED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = []

    def execute(self, requests):
        self.calls.append([int(pb_utils.get_input_tensor_by_name(r, "A").as_numpy().sum()) for r in requests])
        seen = np.array([[len(self.calls)]], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", seen)]) for _ in requests]
"""


def test_model_warmup_runs_before_the_model_is_ready(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    io = (
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    warm = io + (
        "model_warmup [ { name: 'from_file' batch_size: 2 count: 3\n"
        "  inputs { key: 'A' value: { data_type: TYPE_INT32 dims: [ 2 ] input_data_file: 'a.bin' } } } ]\n"
    )
    broken = io + (
        "model_warmup [ { name: 'nofile' batch_size: 1\n"
        "  inputs { key: 'A' value: { data_type: TYPE_INT32 dims: [ 2 ] input_data_file: 'gone.bin' } } } ]\n"
    )
    repo = tmp_path / "repo"
    _model(repo, "warm", warm, WARMED)
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "a.bin").write_bytes(np.array([20, 1], np.int32).tobytes())
    _model(repo, "broken", broken, WARMED)
    server = server_factory(repo)
    with Client(server.url, timeout=30) as client:
        # three warmup runs of two requests came first, so this request is the model's fourth execute
        assert client.infer("warm", {"A": np.ones((1, 2), np.int32)}).as_numpy("Y")[0, 0] == 4
        with pytest.raises(ServerError, match="model_warmup 'nofile'.*gone.bin"):
            client.infer("broken", {"A": np.ones((1, 2), np.int32)})


AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        if "IN" not in [t["name"] for t in config["input"]]:
            auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", 2 * pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def test_auto_complete_config_completes_a_missing_or_partial_config(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    _model(repo, "partial", 'backend: "python"\n', AUTO_COMPLETE)
    (repo / "noconfig" / "1").mkdir(parents=True)
    (repo / "noconfig" / "1" / "model.py").write_text(AUTO_COMPLETE)
    server = server_factory(repo)
    x = np.array([[1.0, 2.0]], np.float32)
    with Client(server.url, timeout=30) as client:
        for name in ("partial", "noconfig"):
            np.testing.assert_array_equal(client.infer(name, {"IN": x}).as_numpy("OUT"), 2 * x)
            config = client.model_config(name)
            assert config["max_batch_size"] == 4 and config["backend"] == "python"
            assert [t["name"] for t in config["input"]] == ["IN"] and config["output"][0]["dims"] == [2]
            assert config["dynamic_batching"]["preferred_batch_size"] == [4]
            metadata = client.model_metadata(name)
            assert metadata["inputs"][0]["shape"] == [-1, 2]
