"""tritonclient-shaped helpers: InferInput checks, the two input/output forms, result dicts."""

from __future__ import annotations

import numpy as np
import pytest

from zinfer.client import (
    Client,
    ClientError,
    InferenceServerClient,
    InferenceServerException,
    InferInput,
    InferRequestedOutput,
    InferResult,
    NotFound,
    np_to_triton_dtype,
    triton_to_np_dtype,
)
from zinfer.client.triton_compat import input_arrays, model_version, output_names


def test_infer_input_describes_itself() -> None:
    inp = InferInput("INPUT0", [2, 16], "FP32")
    assert (inp.name(), inp.shape(), inp.datatype()) == ("INPUT0", [2, 16], "FP32")
    assert inp.data() is None
    x = np.zeros((2, 16), np.float32)
    assert inp.set_data_from_numpy(x) is inp
    assert inp.data() is x
    assert inp.set_shape([1, 16]).shape() == [1, 16]
    assert "INPUT0" in repr(inp)


def test_set_data_checks_datatype_and_shape_like_tritonclient() -> None:
    inp = InferInput("INPUT0", [2, 16], "FP32")
    with pytest.raises(ClientError, match="unexpected datatype FP64 from numpy array, expected FP32"):
        inp.set_data_from_numpy(np.zeros((2, 16), np.float64))
    with pytest.raises(ClientError, match=r"unexpected numpy array shape \[2,15\], expected \[2,16\]"):
        inp.set_data_from_numpy(np.zeros((2, 15), np.float32))
    with pytest.raises(ClientError, match="must be a numpy array"):
        inp.set_data_from_numpy([[1.0] * 16] * 2)  # type: ignore[arg-type]
    assert inp.data() is None  # nothing set by a failed call


def test_bytes_inputs_take_object_bytes_and_str_arrays() -> None:
    inp = InferInput("TEXT", [2, 1], "BYTES")
    for arr in (
        np.array([[b"a"], [b"b"]], dtype=object),
        np.array([["a"], ["b"]]),
        np.array([[b"a"], [b"bc"]]),
    ):
        assert inp.set_data_from_numpy(arr) is inp
        assert inp.data() is arr and input_arrays([inp])["TEXT"] is arr
    with pytest.raises(InferenceServerException, match="datatype"):
        inp.set_data_from_numpy(np.zeros((2, 1), np.float32))  # numbers are not BYTES


def test_shared_memory_calls_point_to_empty() -> None:
    with pytest.raises(ClientError, match="empty"):
        InferInput("X", [1], "FP32").set_shared_memory("region", 4)
    out = InferRequestedOutput("Y")
    with pytest.raises(ClientError):
        out.set_shared_memory("region", 4)
    assert out.unset_shared_memory() is out


def test_requested_output() -> None:
    assert InferRequestedOutput("OUTPUT0").name() == "OUTPUT0"
    assert InferRequestedOutput("OUTPUT0", binary_data=False).name() == "OUTPUT0"
    with pytest.raises(ClientError, match="class_count"):
        InferRequestedOutput("OUTPUT0", class_count=3)


def test_input_forms() -> None:
    a, b = np.ones((1, 2), np.float32), np.zeros((1, 2), np.int64)
    mapping = {"A": a}
    assert input_arrays(mapping) is mapping
    named = input_arrays(
        [
            InferInput("B", [1, 2], "INT64").set_data_from_numpy(b),
            InferInput("A", [1, 2], "FP32").set_data_from_numpy(a),
        ]
    )
    assert list(named) == ["B", "A"] and named["A"] is a  # order kept: the first input gives the batch
    with pytest.raises(ClientError, match="no data"):
        input_arrays([InferInput("A", [1, 2], "FP32")])
    with pytest.raises(ClientError, match="twice"):
        x = InferInput("A", [1, 2], "FP32").set_data_from_numpy(a)
        input_arrays([x, x])
    with pytest.raises(ClientError, match="InferInput"):
        input_arrays([a])  # type: ignore[list-item]


def test_output_forms() -> None:
    assert output_names(None) is None
    assert output_names(["A", InferRequestedOutput("B")]) == ["A", "B"]
    assert output_names([]) == []
    with pytest.raises(ClientError, match="one string"):
        output_names("A")
    with pytest.raises(ClientError):
        output_names([3])  # type: ignore[list-item]


@pytest.mark.parametrize(("given", "expected"), [("", 0), ("2", 2), (3, 3), (0, 0)])
def test_model_versions(given: int | str, expected: int) -> None:
    assert model_version(given) == expected


@pytest.mark.parametrize("bad", ["latest", "-1", True, 1.5])
def test_bad_model_versions(bad: object) -> None:
    with pytest.raises(ClientError):
        model_version(bad)  # type: ignore[arg-type]


def test_dtype_helpers() -> None:
    assert np_to_triton_dtype(np.float32) == "FP32"
    assert np_to_triton_dtype(np.dtype(object)) == "BYTES"
    assert np_to_triton_dtype(np.complex64) is None
    assert triton_to_np_dtype("INT64") is np.int64
    assert triton_to_np_dtype("BYTES") is np.object_
    assert triton_to_np_dtype("NOPE") is None


def test_result_dicts_like_tritonclient_http() -> None:
    r = InferResult(
        "m",
        3,
        "id-1",
        {"Y": np.zeros((2, 4), np.float32), "T": np.array([b"x"], dtype=object)},
        {"Y": "FP32"},
    )
    assert r.get_output("Y") == {"name": "Y", "datatype": "FP32", "shape": [2, 4]}
    assert r.get_output("T") == {"name": "T", "datatype": "BYTES", "shape": [1]}  # from the dtype
    assert r.get_output("missing") is None
    assert r.get_response() == {
        "model_name": "m",
        "model_version": "3",
        "id": "id-1",
        "outputs": [r.get_output("Y"), r.get_output("T")],
    }


def test_every_zinfer_error_is_an_inference_server_exception() -> None:
    with pytest.raises(InferenceServerException):
        raise NotFound("no model")
    with pytest.raises(InferenceServerException):
        InferInput("X", [1], "FP32").set_data_from_numpy(np.zeros(2, np.float32))


def test_the_client_answers_to_tritonclient_s_name() -> None:
    assert InferenceServerClient is Client
