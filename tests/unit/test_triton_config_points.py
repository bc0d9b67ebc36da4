"""Config fields of Triton repositories that zinfer accepts, shows, or refuses with a reason (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zinfer.broker.validation import check_request
from zinfer.client.errors import ConfigError, InvalidArgument
from zinfer.client.protocol import InferRequest, ShmRef, TensorRef
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.repository import load_model_entry
from zinfer.modelconfig.signature import Signature

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
