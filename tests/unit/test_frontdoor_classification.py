"""Triton's classification extension in the front door (``zinfer.frontdoor.classification``): the top-N
strings and their shapes as Triton's TopkClassifications makes them, and label files read safely."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import InvalidArgument
from zinfer.frontdoor.bridge_records import InferReply, Tensor
from zinfer.frontdoor.classification import LabelFiles, classify_reply, parse_class_count, top_k


def _t(data: Any, datatype: str = "FP32") -> Tensor:
    arr = np.asarray(data)
    return Tensor("OUT", datatype, tuple(arr.shape), arr)


def _strings(t: Tensor) -> list[Any]:
    return (
        [[v.decode() for v in row] for row in t.data.tolist()]
        if t.data.ndim == 2
        else [v.decode() for v in t.data.tolist()]
    )


def test_tritons_documented_example() -> None:
    # extension_classification.md: [1.1, 3.3, 0.5, 2.4] with classification 2 is [3.3:1, 2.4:3], shape [2]
    out = top_k(_t(np.array([1.1, 3.3, 0.5, 2.4], np.float32)), 2, batched=False)
    assert out.datatype == "BYTES" and out.shape == (2,) and out.data.shape == (2,)
    assert _strings(out) == ["3.300000:1", "2.400000:3"]  # std::to_string: %f, six decimals
    labels = (b"index_0_label", b"index_1_label", b"index_2_label", b"index_3_label")
    labelled = top_k(_t(np.array([1.1, 3.3, 0.5, 2.4], np.float32)), 2, batched=False, labels=labels)
    assert _strings(labelled) == ["3.300000:1:index_1_label", "2.400000:3:index_3_label"]


def test_ties_go_to_the_lower_index_and_nan_ranks_last() -> None:
    out = top_k(_t([[1.0, 5.0, 10.0, np.nan, 10.0, 5.0, -np.inf]]), 7, batched=True)
    assert _strings(out) == [
        ["10.000000:2", "10.000000:4", "5.000000:1", "5.000000:5", "1.000000:0", "-inf:6", "nan:3"]
    ]
    ints = top_k(_t(np.array([[3, 7, 7, 0, 7]], np.uint8), "UINT8"), 3, batched=True)
    assert _strings(ints) == [["7:1", "7:2", "7:4"]]


def test_a_count_past_the_classes_returns_them_all() -> None:
    out = top_k(_t(np.array([[2, -9, 4]], np.int64), "INT64"), 10, batched=True)
    assert out.shape == (1, 3) and _strings(out) == [["4:2", "2:0", "-9:1"]]


def test_a_batch_of_two_is_classified_row_by_row() -> None:
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((2, 50)).astype(np.float32)
    labels = tuple(f"class {k}".encode() for k in range(50))
    out = top_k(_t(scores), 3, batched=True, labels=labels)
    assert out.shape == (2, 3) and out.data.shape == (2, 3)
    for row, got in zip(scores, _strings(out), strict=True):
        best = np.argsort(-row, kind="stable")[:3]
        assert got == [f"{float(row[k]):.6f}:{k}:class {k}" for k in best]  # indices count within the row


def test_a_model_without_batching_gets_shape_n_over_the_whole_tensor() -> None:
    out = top_k(_t(np.array([[1, 9], [5, 3]], np.int32), "INT32"), 2, batched=False)
    assert out.shape == (2,) and _strings(out) == ["9:1", "5:2"]


def test_labels_short_or_empty_give_value_and_index_only() -> None:
    out = top_k(_t(np.array([1, 2, 3], np.float64), "FP64"), 3, batched=False, labels=(b"a", b""))
    assert _strings(out) == ["3.000000:2", "2.000000:1", "1.000000:0:a"]


@pytest.mark.parametrize("datatype", ["BYTES", "BOOL", "FP16", "BF16"])
def test_non_numeric_outputs_are_refused_with_tritons_text(datatype: str) -> None:
    data = np.array([b"a", b"b"], dtype=np.object_) if datatype == "BYTES" else np.zeros(2, np.float16)
    with pytest.raises(InvalidArgument) as err:
        top_k(Tensor("OUT", datatype, (2,), data), 1, batched=False)
    assert str(err.value) == f"class result not available for output due to unsupported type '{datatype}'"


def test_a_row_past_a_million_elements_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="classification output tensor too large"):
        top_k(_t(np.zeros((1, 1_000_001), np.float32)), 1, batched=True)


def test_the_class_count_parameter() -> None:
    assert parse_class_count(3, "O") == 3 and parse_class_count(0, "O") == 0
    for bad in (True, 1.5, "3", -1):
        with pytest.raises(InvalidArgument, match="'classification' parameter"):
            parse_class_count(bad, "O")


# ------------------------------------------------------------------------------------------ label files


def _model(tmp_path: Path, text: bytes = b"cat\ndog\r\nbird\n") -> Path:
    folder = tmp_path / "repo" / "m"
    folder.mkdir(parents=True)
    (folder / "labels.txt").write_bytes(text)
    return tmp_path / "repo"


def test_labels_are_read_one_per_line_and_read_again_when_the_file_changes(tmp_path: Path) -> None:
    files = LabelFiles(_model(tmp_path))
    assert files.labels("m", "labels.txt") == (b"cat", b"dog", b"bird")
    path = tmp_path / "repo" / "m" / "labels.txt"
    path.write_bytes(b"one\ntwo")
    os.utime(path, ns=(1, 1))
    assert files.labels("m", "labels.txt") == (b"one", b"two")
    assert LabelFiles(None).labels("m", "labels.txt") == ()


@pytest.mark.parametrize(
    ("model", "filename", "match"),
    [
        ("m", "../other.txt", "not a plain relative name"),
        ("m", "/etc/passwd", "not a plain relative name"),
        ("..", "labels.txt", "not a model folder name"),
        ("m/x", "labels.txt", "not a model folder name"),
        ("m", "missing.txt", "cannot be read"),
        ("m", "link.txt", "is not inside"),
        ("m", "sub", "not a regular file"),
        ("m", "big.txt", "more than 64"),
    ],
)
def test_label_files_that_cannot_be_used_are_refused(
    tmp_path: Path, model: str, filename: str, match: str
) -> None:
    repo = _model(tmp_path)
    (tmp_path / "secret.txt").write_text("secret\n")
    (repo / "m" / "link.txt").symlink_to(tmp_path / "secret.txt")
    (repo / "m" / "sub").mkdir()
    (repo / "m" / "big.txt").write_bytes(b"x\n" * 40)
    with pytest.raises(InvalidArgument, match=match):
        LabelFiles(repo, max_bytes=64).labels(model, filename)


def test_a_symlink_within_the_model_folder_is_followed(tmp_path: Path) -> None:
    repo = _model(tmp_path)
    (repo / "m" / "alias.txt").symlink_to("labels.txt")
    assert LabelFiles(repo).labels("m", "alias.txt") == (b"cat", b"dog", b"bird")


# ------------------------------------------------------------------------------------------ replies


class _Configs:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.asked: list[tuple[str, str]] = []

    async def model_config(self, model: str, version: str = "") -> Mapping[str, Any]:
        self.asked.append((model, version))
        return self.config


def test_a_reply_gets_its_classified_outputs_with_the_configs_labels(tmp_path: Path) -> None:
    config = {
        "max_batch_size": 4,
        "output": [{"name": "OUT", "label_filename": "labels.txt"}, {"name": "RAW"}],
    }
    configs = _Configs(config)
    raw = Tensor("RAW", "FP32", (1, 3), np.array([[1, 2, 3]], np.float32))
    reply = InferReply("m", "1", "", (_t(np.array([[0.5, 0.25, 0.75]], np.float32)), raw))
    out = asyncio.run(classify_reply(configs, LabelFiles(_model(tmp_path)), reply, {"OUT": 2}))
    assert configs.asked == [("m", "1")]  # the config of the version that answered
    assert out.outputs[1] is raw
    assert out.outputs[0].shape == (1, 2) and _strings(out.outputs[0]) == [
        ["0.750000:2:bird", "0.500000:0:cat"]
    ]
    assert asyncio.run(classify_reply(configs, LabelFiles(None), reply, {})) is reply
