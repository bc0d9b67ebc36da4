"""Scanning a Triton-layout model repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.repository import (
    ModelEntry,
    available_versions,
    load_model_entry,
    read_model_dir_config,
    scan_repository,
    select_versions,
)
from zinfer.modelconfig.version_policy import VersionPolicy

IO = """
backend: "zinfer"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def make_model(root: Path, name: str, config: str | None = IO, versions: tuple[str, ...] = ("1",)) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    for version in versions:
        (folder / version).mkdir()
    return folder


def by_name(entries: list[ModelEntry]) -> dict[str, ModelEntry]:
    return {entry.name: entry for entry in entries}


def test_scan_loads_good_models_and_marks_bad_ones(tmp_path: Path) -> None:
    make_model(tmp_path, "good", versions=("1", "2", "10"))
    make_model(tmp_path, "broken", config="max_batch_size: x\n")
    make_model(tmp_path, "seq", config=IO + "sequence_batching { }\noptimization { eager_batching: true }\n")
    make_model(tmp_path, "noversion", versions=())
    make_model(tmp_path, "noconfig", config=None)
    make_model(tmp_path, ".hidden")
    (tmp_path / "README.md").write_text("not a model")

    entries = scan_repository(tmp_path)
    assert [e.name for e in entries] == ["broken", "good", "noconfig", "noversion", "seq"]
    models = by_name(entries)

    good = models["good"]
    assert good.error is None and good.versions == (10,) and good.path == tmp_path / "good"
    assert good.config is not None and good.config.name == "good"

    broken = models["broken"]
    assert broken.config is None and broken.versions == ()
    assert (
        broken.error
        == f"{tmp_path / 'broken' / 'config.pbtxt'}:1: field 'max_batch_size': expected an integer, got 'x'"
    )

    seq = models["seq"]
    assert seq.error == "not supported yet: optimization"
    assert seq.config is not None

    assert models["noversion"].error is not None and "no version folder" in models["noversion"].error
    assert models["noconfig"].error is not None and "no config.pbtxt" in models["noconfig"].error


def test_name_must_match_folder(tmp_path: Path) -> None:
    make_model(tmp_path, "add", config='name: "other"\n' + IO)
    (entry,) = scan_repository(tmp_path)
    assert entry.config is None
    assert (
        entry.error is not None
        and ":1: field 'name': 'other' must equal the model's directory name 'add'" in entry.error
    )


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        ("", (3,)),
        ("version_policy { latest { num_versions: 2 } }", (2, 3)),
        ("version_policy { latest { num_versions: 9 } }", (1, 2, 3)),
        ("version_policy { all { } }", (1, 2, 3)),
        ("version_policy { specific { versions: [ 3, 1 ] } }", (1, 3)),
    ],
)
def test_version_selection(tmp_path: Path, policy: str, versions: tuple[int, ...]) -> None:
    make_model(tmp_path, "m", config=IO + policy, versions=("1", "2", "3", "notaversion"))
    (tmp_path / "m" / "7").write_text("a file, not a version folder")
    entry = load_model_entry(tmp_path / "m")
    assert entry.error is None
    assert entry.versions == versions


def test_specific_version_missing_is_an_error(tmp_path: Path) -> None:
    make_model(tmp_path, "m", config=IO + "version_policy { specific { versions: [ 1, 4 ] } }")
    entry = load_model_entry(tmp_path / "m")
    assert entry.config is not None and entry.versions == ()
    assert entry.error is not None and "version 4" in entry.error and "no folder" in entry.error


def test_available_versions(tmp_path: Path) -> None:
    make_model(tmp_path, "m", versions=("2", "10", "1", "x1", ".3"))
    assert available_versions(tmp_path / "m") == (1, 2, 10)
    (tmp_path / "m" / "01").mkdir()
    with pytest.raises(ConfigError, match="both version 1"):
        available_versions(tmp_path / "m")


def test_select_versions_directly(tmp_path: Path) -> None:
    assert select_versions(VersionPolicy(), [], tmp_path) == ()
    assert select_versions(VersionPolicy("latest", 2), [5, 1, 3], tmp_path) == (3, 5)
    assert select_versions(VersionPolicy("all", 0), [5, 1], tmp_path) == (1, 5)
    with pytest.raises(ConfigError, match="version 2"):
        select_versions(VersionPolicy("specific", 0, (2,)), [1], tmp_path)


def test_missing_repository_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a folder"):
        scan_repository(tmp_path / "nope")


def test_empty_repository(tmp_path: Path) -> None:
    assert scan_repository(tmp_path) == []


def test_a_config_naming_no_backend_takes_it_from_the_model_file(tmp_path: Path) -> None:
    """As Triton: tritonclient's model-control example loads ``simple`` with the override config
    ``{"max_batch_size": 16}``, which names no platform; model.onnx makes it an ONNX model, completed from
    its graph, and model.py a python one."""
    pytest.importorskip("onnx")
    from tests.onnx_models import simple

    onnx_model = make_model(tmp_path, "simple", 'name: "simple"\nmax_batch_size: 16\n')
    simple(onnx_model / "1" / "model.onnx")
    entry = load_model_entry(onnx_model)
    assert entry.error is None and entry.config is not None
    assert entry.config.platform == "onnxruntime_onnx" and entry.config.max_batch_size == 16
    assert [t.name for t in entry.config.input] == ["INPUT0", "INPUT1"]
    python_model = make_model(tmp_path, "py", 'name: "py"\nmax_batch_size: 2\n')
    (python_model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    assert read_model_dir_config(python_model).backend == "python"
    bare = make_model(tmp_path, "bare", 'name: "bare"\nmax_batch_size: 2\n')  # no model file: still refused
    error = load_model_entry(bare).error
    assert error is not None and "names no backend and no platform" in error
