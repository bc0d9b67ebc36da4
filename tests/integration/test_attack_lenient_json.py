"""Attack (issue 30, item 7): lenient JSON on the HTTP door.

Before the fix ragged ``data`` (``[[1],[[2]]]``) was flattened and taken, ``1e999`` became an infinity that
came back as a bare ``Infinity`` (not JSON: strict parsers reject the whole reply), and the literals
``NaN``/``Infinity`` were taken as numbers. Now ragged data is refused with Triton's shape text,
non-finite input with the text of Triton's JSON parser (rapidjson) for a strict parse, and an FP32
output holding an infinity or a NaN is written as ``null`` in a JSON reply (as JSON.stringify does; its
exact value goes as binary data when the client asks for that).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.frontdoor_helpers import repository, serve_front_doors

pytestmark = pytest.mark.integration

INFER = "/v2/models/add/infer"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = repository(tmp_path_factory.mktemp("json"), ("add",))
    with serve_front_doors(repo) as (http_url, _grpc_url):
        yield http_url


def _strict(text: bytes) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are not numbers there."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _post(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://{url}{INFER}", data=body)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, _strict(r.read())
    except urllib.error.HTTPError as err:
        return err.code, _strict(err.read())


def _body(a: str, b: str = "[[0.0]]", shape_a: str = "[1, 1]", extra: str = "") -> bytes:
    return (
        '{"inputs": ['
        f'{{"name": "INPUT_A", "datatype": "FP32", "shape": {shape_a}, "data": {a}}},'
        f'{{"name": "INPUT_B", "datatype": "FP32", "shape": {shape_a}, "data": {b}}}]'
        f"{extra}}}"
    ).encode()


RAGGED = ["[[1.0], [[2.0]]]", "[[[1.0]], [2.0]]", "[[1.0, 2.0], []]", "[1.0, [2.0]]"]


@pytest.mark.parametrize("ragged", RAGGED)
def test_ragged_data_is_refused(url: str, ragged: str) -> None:
    status, body = _post(url, _body(ragged, "[[0.0], [0.0]]", "[2, 1]"))
    assert status == 400, body
    assert body["error"] == "Unable to parse 'data': Shape does not match true shape of 'data' field"


@pytest.mark.parametrize("value", ["1e999", "-1e999", "NaN", "Infinity", "-Infinity"])
def test_non_finite_input_is_refused(url: str, value: str) -> None:
    status, body = _post(url, _body(f"[[{value}]]"))
    assert status == 400, body
    assert body["error"].startswith("failed to parse the request JSON buffer: "), body
    text = "Number too big to be stored in double." if "e999" in value else "Invalid value."
    assert text in body["error"]


def test_non_finite_parameters_are_refused(url: str) -> None:
    status, body = _post(url, _body("[[1.0]]", extra=', "parameters": {"x": 1e999}'))
    assert status == 400 and "Number too big to be stored in double." in body["error"], body
    status, body = _post(url, _body("[[1.0]]", extra=', "parameters": {"x": NaN}'))
    assert status == 400 and "Invalid value." in body["error"], body


def test_a_value_that_overflows_fp32_is_refused(url: str) -> None:
    status, body = _post(url, _body("[[1e300]]"))
    assert status == 400 and "does not fit FP32" in body["error"], body


def test_nested_and_flat_data_of_the_right_shape_still_work(url: str) -> None:
    for a, b in (("[[1.5], [2.0]]", "[[0.5], [1.0]]"), ("[1.5, 2.0]", "[0.5, 1.0]")):
        status, body = _post(url, _body(a, b, "[2, 1]"))
        assert status == 200, body
        assert body["outputs"][0]["data"] == [2.0, 3.0]


def test_an_infinite_output_is_null_in_json_and_exact_in_binary(url: str) -> None:
    """3e38 + 3e38 overflows FP32 in the model: the reply stays JSON (null), never a bare Infinity."""
    status, body = _post(url, _body("[[3e38], [-3e38], [1.0]]", "[[3e38], [-3e38], [2.0]]", "[3, 1]"))
    assert status == 200, body
    assert body["outputs"][0]["data"] == [None, None, 3.0]
    client = httpclient.InferenceServerClient(url)
    try:
        a = np.array([[3e38], [-3e38], [1.0]], np.float32)
        inputs = []
        for name in ("INPUT_A", "INPUT_B"):
            inp = httpclient.InferInput(name, [3, 1], "FP32")
            inp.set_data_from_numpy(a, binary_data=True)
            inputs.append(inp)
        for binary in (False, True):
            out = httpclient.InferRequestedOutput("OUTPUT_SUM", binary_data=binary)
            got = client.infer("add", inputs, outputs=[out]).as_numpy("OUTPUT_SUM").reshape(-1)
            if binary:
                assert got.tolist() == [np.inf, -np.inf, 2.0]
            else:  # tritonclient reads null as NaN: the value is not a number it can show
                assert np.isnan(got[0]) and np.isnan(got[1]) and got[2] == 2.0
    finally:
        client.close()
