"""Config fields of Triton repositories that zinfer accepts, shows, or refuses with a reason (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zinfer.broker.validation import check_request
from zinfer.client.errors import ConfigError, InvalidArgument
from zinfer.client.protocol import InferRequest, ShmRef, TensorRef
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.modelconfig.repository import load_model_entry
from zinfer.modelconfig.signature import Signature
from zinfer.modelconfig.warmup import check_warmup, request_arrays

PY_IO = """
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _model(root: Path, config: str, files: tuple[str, ...] = ("model.py",)) -> Path:
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    for name in files:
        (folder / "1" / name).write_text("")
    return folder


def test_a_python_model_with_default_model_filename_loads(tmp_path: Path) -> None:
    entry = load_model_entry(_model(tmp_path, PY_IO + 'default_model_filename: "net.py"\n', ("net.py",)))
    assert entry.error is None and entry.config is not None
    assert entry.config.default_model_filename == "net.py"


def test_execution_env_path_is_refused_with_the_reason(tmp_path: Path) -> None:
    config = (
        PY_IO
        + 'parameters { key: "EXECUTION_ENV_PATH" '
        + 'value { string_value: "$$TRITON_MODEL_DIRECTORY/e.tar.gz" } }'
    )
    entry = load_model_entry(_model(tmp_path, config))
    assert entry.error is not None
    assert "EXECUTION_ENV_PATH" in entry.error and "conda-pack" in entry.error
    assert "server's own Python environment" in entry.error


def test_input_format_is_accepted_and_shown() -> None:
    c = parse_model_config(
        "max_batch_size: 2 "
        'input [ { name: "I" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 8, 8, 3 ] } ]',
        source="t",
        model_name="m",
    )
    assert json.loads(json.dumps(c.to_dict()))["input"][0]["format"] == "FORMAT_NHWC"


@pytest.mark.parametrize("fmt", ["FORMAT_NCHW", "FORMAT_NHWC"])
def test_an_image_format_needs_three_dims(fmt: str) -> None:
    with pytest.raises(ConfigError, match=f"{fmt} requires 3 dims, got \\[3, 8\\]"):
        parse_model_config(
            f'input [ {{ name: "I" data_type: TYPE_FP32 format: {fmt} dims: [ 3, 8 ] }} ]',
            source="t",
            model_name="m",
        )


# ----------------------------------------------------------------------------- optional inputs

OPTIONAL = Signature.of(
    parse_model_config(
        """
        max_batch_size: 4
        input [
          { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
          { name: "O" data_type: TYPE_FP32 dims: [ 2 ] optional: true }
        ]
        output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
        """,
        source="t",
        model_name="m",
    )
)


class _AnyRegion:
    def check(self, client: bytes, ref: ShmRef) -> None:
        return None


def _check(shapes: dict[str, tuple[int, ...]]) -> object:
    refs = tuple(TensorRef(n, "FP32", s, frame=i) for i, (n, s) in enumerate(shapes.items()))
    frames = [b"\0" * (4 * s[0] * s[1]) for s in shapes.values()]
    return check_request(InferRequest("r", "m", 0, refs), frames, OPTIONAL, _AnyRegion(), b"c")


def test_an_optional_input_may_be_left_out() -> None:
    without = _check({"A": (1, 2)})
    with_it = _check({"A": (1, 2), "O": (1, 2)})
    assert without.batch_size == with_it.batch_size == 1  # type: ignore[attr-defined]
    # requests that leave out different optional inputs never share a batch (Triton cuts there too)
    assert without.shape_key != with_it.shape_key  # type: ignore[attr-defined]


def test_a_missing_required_input_is_named_as_triton_names_it() -> None:
    with pytest.raises(InvalidArgument) as info:
        _check({"O": (1, 2)})
    assert (
        "expected number of inputs between 1 and 2 but got 1 inputs for model 'm'. Got input(s) ['O'], "
        "but missing required input(s) ['A']. Please provide all required input(s)."
    ) in str(info.value)


# ----------------------------------------------------------------------------- model_warmup

WARM_IO = """
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 2 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _warm(sample: str) -> ModelConfig:
    return parse_model_config(
        WARM_IO + f"model_warmup [ {{ name: 'w' batch_size: 2 {sample} }} ]", source="t", model_name="m"
    )


@pytest.mark.parametrize(
    "sample, message",
    [
        (
            "inputs { key: 'X' value: { data_type: TYPE_FP32 dims: [ 1, 2 ] zero_data: true } }",
            "no input 'X'",
        ),
        (
            "inputs { key: 'A' value: { data_type: TYPE_INT32 dims: [ 1, 2 ] zero_data: true } }",
            "is TYPE_INT32",
        ),
        (
            "inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 3, 3 ] zero_data: true } }",
            r"dims \[3, 3\]",
        ),
        (
            "inputs { key: 'S' value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }",
            "no data for input 'A'",
        ),
    ],
)
def test_warmup_samples_are_checked_against_the_inputs(sample: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_warmup(_warm(sample))


def test_warmup_request_arrays(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    zero = _warm("inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 3, 2 ] zero_data: true } }")
    check_warmup(zero)
    arrays = request_arrays(zero, zero.model_warmup[0], tmp_path, rng)
    assert arrays["A"].shape == (1, 3, 2) and not arrays["A"].any()  # one row, with its batch dim
    rand = _warm(
        "inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 1, 2 ] random_data: true } }"
        "inputs { key: 'S' value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }"
    )
    arrays = request_arrays(rand, rand.model_warmup[0], tmp_path, rng)
    assert arrays["A"].dtype == np.float32 and arrays["S"].tolist() == [[b"", b""]]  # strings: zero data
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.bin").write_bytes(np.arange(2, dtype=np.float32).tobytes())
    (tmp_path / "warmup" / "s.bin").write_bytes(b"\x02\x00\x00\x00hi\x00\x00\x00\x00")
    from_file = _warm(
        "inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 1, 2 ] input_data_file: 'a.bin' } }"
        "inputs { key: 'S' value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: 's.bin' } }"
    )
    arrays = request_arrays(from_file, from_file.model_warmup[0], tmp_path, rng)
    assert arrays["A"].tolist() == [[[0.0, 1.0]]] and arrays["S"].tolist() == [[b"hi", b""]]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("../outside.bin", None, "is not a plain relative name"),
        ("missing.bin", None, "cannot be read"),
        ("short.bin", b"\0" * 4, "needs 8 bytes"),
    ],
)
def test_warmup_files_are_checked(tmp_path: Path, name: str, content: bytes | None, message: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 8)
    if content is not None:
        (tmp_path / "warmup" / name).write_bytes(content)
    config = _warm(
        f"inputs {{ key: 'A' value: {{ data_type: TYPE_FP32 dims: [ 1, 2 ] input_data_file: '{name}' }} }}"
    )
    with pytest.raises(ConfigError, match=message):
        request_arrays(config, config.model_warmup[0], tmp_path, np.random.default_rng(0))


def test_a_warmup_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    (tmp_path / "warmup" / "link.bin").symlink_to(tmp_path / "secret.bin")
    config = _warm(
        "inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 1, 2 ] input_data_file: 'link.bin' } }"
    )
    with pytest.raises(ConfigError, match="is not inside"):
        request_arrays(config, config.model_warmup[0], tmp_path, np.random.default_rng(0))
