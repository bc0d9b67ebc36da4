"""A request-by-request model's outputs: the config check that an output kind passed once is not made again
(``batch_io.check_output``'s memo) must still refuse what it refused, and a request whose later output fails
leaves none of its earlier outputs' frames in the RESULT (``request_batch._answer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import InternalError, Status
from zinfer.client.protocol import OutputRequest, TensorRef
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers import batch_io
from zinfer.workers.batch_io import BatchRequest, check_output
from zinfer.workers.model import RequestInputs, RequestModel, RequestResult
from zinfer.workers.regions import RegionCache
from zinfer.workers.request_batch import run_requests

CONFIG = parse_model_config(
    """
    name: "two"
    backend: "zinfer"
    max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [
      { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
      { name: "B" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    """,
    source="test",
    model_name="two",
)
SIG = Signature.of(CONFIG)


def test_a_passed_kind_passes_again_and_other_kinds_are_still_checked() -> None:
    good = np.zeros((3, 2), np.float32)
    assert check_output("A", good, SIG, 3) is good
    assert check_output("A", np.ones((3, 2), np.float32), SIG, 3) is not None  # the memo's answer
    with pytest.raises(InternalError, match="batch size 2, the inputs had 3"):
        check_output("A", np.zeros((2, 2), np.float32), SIG, 3)
    with pytest.raises(InternalError, match="has dtype float64"):
        check_output("A", np.zeros((3, 2), np.float64), SIG, 3)
    with pytest.raises(InternalError, match="has shape"):
        check_output("A", np.zeros((3, 3), np.float32), SIG, 3)
    with pytest.raises(InternalError, match="must hold bytes or strings"):
        check_output("B", np.zeros((3, 2), np.float32), SIG, 3)
    with pytest.raises(InternalError, match="batch size 3, the inputs had 4"):  # same array, other rows
        check_output("A", good, SIG, 4)


def test_the_memo_is_bounded() -> None:
    for rows in range(1, batch_io.MAX_PASSED + 40):
        check_output("A", np.zeros((rows, 2), np.float32), SIG, rows)
        assert len(batch_io._PASSED) <= batch_io.MAX_PASSED


class Outputs(RequestModel):
    """Answers each request with the outputs it was built with."""

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.outputs = outputs

    def execute_requests(self, requests: Sequence[RequestInputs], /) -> Sequence[RequestResult]:
        return [dict(self.outputs) for _ in requests]


def _run(outputs: dict[str, Any], n: int = 2) -> Any:
    frames = [np.zeros((1, 2), np.float32).tobytes()]
    x = (TensorRef("X", "FP32", (1, 2), None, 0),)
    want = (OutputRequest("A"), OutputRequest("B"))
    requests = [BatchRequest(i + 1, x, want) for i in range(n)]
    return run_requests(Outputs(outputs), SIG, requests, frames, RegionCache())


def test_a_request_whose_second_output_fails_leaves_no_frames() -> None:
    out = _run({"A": np.ones((1, 2), np.float32), "B": np.zeros((1, 1), np.complex64)})
    assert [r.status for r in out.results] == [Status.INTERNAL, Status.INTERNAL]
    assert "which no tensor type can carry" in out.results[0].error
    assert out.frames == []


def test_outputs_are_numbered_across_the_result() -> None:
    out = _run({"A": np.full((1, 2), 7, np.float32), "B": np.array([[b"hi"]], dtype=object)}, n=3)
    assert all(r.status == Status.OK for r in out.results)
    numbers = [t.frame for r in out.results for t in r.outputs]
    assert numbers == list(range(6))
    a = out.results[2].outputs[0]
    assert np.frombuffer(out.frames[a.frame], np.float32).tolist() == [7.0, 7.0]


def test_a_missing_output_names_every_missing_one() -> None:
    out = _run({"A": np.ones((1, 2), np.float32)}, n=1)
    assert out.results[0].error.endswith("response has no output named 'B'")
    assert out.frames == []
