"""Files a model config names inside its folder (``zinfer.modelconfig.model_files``): label files, checked
at load as Triton does, and warmup sample files, both read under the same rules (plain relative names,
inside the folder, a regular file opened without blocking, a size bound)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.model_files import read_model_file, read_model_file_if_changed, split_labels
from zinfer.modelconfig.repository import load_model_entry
from zinfer.modelconfig.warmup import request_arrays

LABELLED = (
    'backend: "python"\nmax_batch_size: 4\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]\n'
)


def _model(tmp_path: Path, labels: str | None = "a\nb\nc\n") -> Path:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (model_dir / "config.pbtxt").write_text(LABELLED)
    if labels is not None:
        (model_dir / "labels.txt").write_text(labels)
    return model_dir


def test_a_model_with_its_label_file_loads(tmp_path: Path) -> None:
    entry = load_model_entry(_model(tmp_path))
    assert entry.error is None, entry.error


def test_a_missing_label_file_fails_the_load_not_the_first_request(tmp_path: Path) -> None:
    entry = load_model_entry(_model(tmp_path, labels=None))
    assert entry.error is not None
    assert "output 'Y': label_filename 'labels.txt' cannot be read: No such file" in entry.error


def test_a_label_file_leading_out_of_the_model_folder_fails_the_load(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, labels=None)
    (tmp_path / "secret.txt").write_text("secret\n")
    (model_dir / "labels.txt").symlink_to(tmp_path / "secret.txt")
    entry = load_model_entry(model_dir)
    assert entry.error is not None and "label_filename 'labels.txt' is not inside" in entry.error


def test_a_fifo_named_as_a_label_file_is_refused_without_blocking(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, labels=None)
    os.mkfifo(model_dir / "labels.txt")
    result: list[str | None] = []

    def load() -> None:
        result.append(load_model_entry(model_dir).error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():  # unblock the open so the thread can end, then fail
        fd = os.open(model_dir / "labels.txt", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("loading a model whose label file is a FIFO blocked")
    assert result and result[0] is not None and "is not a regular file" in result[0]


WARM = (
    'backend: "python"\nmax_batch_size: 4\n'
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    "model_warmup [ { name: 'w' batch_size: 1\n"
    "  inputs { key: 'A' value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: 'a.bin' } } } ]\n"
)


def test_a_fifo_named_as_a_warmup_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """Failed before: the warmup reader opened the file blocking, so a FIFO hung the loader."""
    (tmp_path / "warmup").mkdir()
    os.mkfifo(tmp_path / "warmup" / "a.bin")
    config = parse_model_config(WARM, source="t", model_name="m")
    errors: list[str] = []

    def build() -> None:
        try:
            request_arrays(config, config.model_warmup[0], tmp_path, np.random.default_rng(0))
        except ConfigError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        fd = os.open(tmp_path / "warmup" / "a.bin", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("building a warmup request from a FIFO blocked")
    assert errors == ["model 'm': model_warmup 'w': input_data_file 'a.bin' is not a regular file"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "is not a plain relative name"),
        ("/etc/passwd", "is not a plain relative name"),
        ("a/../b", "is not a plain relative name"),
        ("a\0b", "is not a plain relative name"),
        ("sub", "is not a regular file"),
        ("big.txt", "has 65 bytes, more than 64"),
        ("nothing.txt", "cannot be read: No such file or directory"),
    ],
)
def test_files_that_cannot_be_used_give_the_reason(tmp_path: Path, name: str, reason: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "big.txt").write_bytes(b"x" * 65)
    with pytest.raises(ConfigError) as caught:
        read_model_file(tmp_path, name, 64)
    assert str(caught.value) == reason


def test_a_file_is_read_again_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "l.txt"
    path.write_bytes(b"x\r\ny\n")
    identity, data = read_model_file_if_changed(tmp_path, "l.txt", 64, None)
    assert data == b"x\r\ny\n" and split_labels(data) == (b"x", b"y")
    assert read_model_file_if_changed(tmp_path, "l.txt", 64, identity) == (identity, None)
    path.write_bytes(b"z")
    os.utime(path, ns=(1, 1))
    again, data = read_model_file_if_changed(tmp_path, "l.txt", 64, identity)
    assert again != identity and data == b"z"
