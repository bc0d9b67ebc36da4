"""A python model's auto_complete_config: pb_utils.ModelConfig, the child process that runs it, the merge."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.client.errors import ConfigError
from zinfer.modelconfig import python_autocomplete
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.python_autocomplete import complete_python_config, merge_auto_complete
from zinfer.modelconfig.repository import load_model_entry, read_model_dir_config
from zinfer.workers import triton_python_backend_utils as pb


def api(extra: str = "") -> pb.ModelConfig:
    return pb.ModelConfig(
        parse_model_config('backend: "python"\n' + extra, source="t", model_name="m").to_dict()
    )


def test_the_api_completes_a_config() -> None:
    c = api()
    c.set_max_batch_size(8)
    c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": False})  # the same: fine
    c.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    c.set_dynamic_batching()
    c.set_model_transaction_policy({"decoupled": False})
    d = c.as_dict()
    assert d["max_batch_size"] == 8 and [t["name"] for t in d["input"]] == ["IN"]
    assert d["dynamic_batching"] == {} and d["model_transaction_policy"] == {"decoupled": False}


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1}),
            "other than",
        ),
        (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}), "missing 'name'"),
        (lambda c: c.add_input({"name": "X", "dims": [1]}), "missing 'data_type'"),
        (lambda c: c.add_output({"name": "X", "data_type": "TYPE_FP32"}), "missing 'dims'"),
        (
            lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]}),
            "expects datatype TYPE_FP32",
        ),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]}), "specifies dims [2]"),
        (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 4"),
        (lambda c: c.set_model_transaction_policy({"other": 1}), "other than 'decoupled'"),
    ],
)
def test_the_api_refuses_as_triton_does(call: object, message: str) -> None:
    c = api('max_batch_size: 4\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(c)  # type: ignore[operator]


def test_dynamic_batching_is_refused_beside_another_scheduler_and_decoupled_cannot_flip() -> None:
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        api("max_batch_size: 2\nsequence_batching { }").set_dynamic_batching()
    c = api("model_transaction_policy { decoupled: true }")
    with pytest.raises(ValueError, match="already set to 'True'"):
        c.set_model_transaction_policy({"decoupled": False})


BASE = parse_model_config(
    'backend: "python"\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [ 1, 2 ] } } ]',
    source="t",
    model_name="m",
)


def test_merge_keeps_the_configs_own_tensors_and_adds_the_models() -> None:
    result = BASE.to_dict() | {
        "max_batch_size": 4,
        "input": [
            *BASE.to_dict()["input"],
            {"name": "B", "data_type": "TYPE_INT64", "dims": [-1], "optional": True},
        ],
        "output": [{"name": "Y", "data_type": "TYPE_STRING", "dims": [1]}],
        "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": True},
    }
    merged = merge_auto_complete(BASE, result, "t")
    assert [t.name for t in merged.input] == ["A", "B"] and merged.input[0] is BASE.input[0]
    assert merged.input[1].optional and merged.input[1].dims == (-1,)
    assert merged.output[0].data_type == "TYPE_STRING" and merged.max_batch_size == 4
    assert merged.dynamic_batching is not None and merged.dynamic_batching.preferred_batch_size == (4,)
    assert merged.decoupled


def test_a_name_cannot_inject_config_text() -> None:
    name = 'Y" } max_batch_size: 99 output { name: "Z'
    merged = merge_auto_complete(
        BASE, {"output": [{"name": name, "data_type": "TYPE_FP32", "dims": [1]}]}, "t"
    )
    assert [t.name for t in merged.output] == [name] and merged.max_batch_size == 0  # one name, as given


@pytest.mark.parametrize(
    "result, message",
    [
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"max_batch_size": 2**40}, "max_batch_size"),
        ({"input": "A"}, "must be a list"),
        ({"output": [["Y"]]}, "must be a dict"),
        ({"output": [{"name": "Y", "data_type": "TYPE_NOPE", "dims": [1]}]}, "data_type"),
        ({"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1.5]}]}, "list of integers"),
        ({"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [0]}]}, "dimension"),
        ({"output": [{"name": "Y\n", "data_type": "TYPE_FP32", "dims": [1]}]}, "printable"),
        ({"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "x": 1}]}, "other than"),
        ({"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}] * 2}, "twice"),
        ({"model_transaction_policy": {"decoupled": "yes"}}, "decoupled"),
    ],
)
def test_hostile_answers_are_refused(result: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        merge_auto_complete(BASE, result, "t")


AUTO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        print("noise on stdout")  # must not spoil the answer
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def _folder(tmp_path: Path, code: str, config: str | None = None) -> Path:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(code)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder


def test_a_folder_without_config_is_completed_by_the_model(tmp_path: Path) -> None:
    entry = load_model_entry(_folder(tmp_path, AUTO))
    assert entry.error is None and entry.config is not None
    c = entry.config
    assert c.backend == "python" and c.max_batch_size == 8
    assert [t.name for t in c.input] == ["IN"] and [t.name for t in c.output] == ["OUT"]
    assert c.dynamic_batching is not None and c.dynamic_batching.preferred_batch_size == (8,)


@pytest.mark.parametrize(
    "body, message",
    [
        ("raise RuntimeError('no weights')", "auto_complete_config raised RuntimeError: no weights"),
        ("return None", "returned NoneType"),
        (
            "auto_complete_model_config.set_max_batch_size(-1)\n        return auto_complete_model_config",
            ">= 0",
        ),
        ("import os\n        os._exit(3)", "exit 3"),
        ("import time\n        time.sleep(60)", "did not finish within 2 s"),
        (
            "open('big', 'wb').write(b'x' * (4 << 20))\n        return auto_complete_model_config",
            "File too large",
        ),
    ],
)
def test_a_failing_auto_complete_fails_the_load_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, message: str
) -> None:
    monkeypatch.setattr(python_autocomplete, "TIMEOUT_S", 2.0)
    code = f"""
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        {body}

    def execute(self, requests):
        return []
"""
    folder = _folder(tmp_path, code, 'backend: "python"\n')
    with pytest.raises(ConfigError, match=message):
        complete_python_config(read_model_dir_config(folder), folder / "1")


def test_a_model_without_auto_complete_is_not_run(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path, "raise SystemExit('never imported')\n", 'backend: "python"\nmax_batch_size: 2\n'
    )
    config = read_model_dir_config(folder)
    assert complete_python_config(config, folder / "1") is config


def test_a_folder_without_config_or_model_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no config.pbtxt"):
        read_model_dir_config(tmp_path / "m")
