"""Arguments of the wrong type to the Triton python-backend API raise ``TypeError``, as Triton's bindings
do (its qa model ``argument_validation`` checks each), while a list holding ``None`` where tensors belong
stays a ``TritonModelException``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from zinfer.workers import triton_python_backend_utils as pb

X = [pb.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]


def _request(**kw: Any) -> Callable[[], object]:
    args: dict[str, Any] = {"inputs": X, "model_name": "m", "requested_output_names": ["y"], **kw}
    return lambda: pb.InferenceRequest(**args)


@pytest.mark.parametrize(
    "call",
    [
        _request(inputs=None),
        _request(model_name=None),
        _request(requested_output_names=[None]),
        _request(requested_output_names=None),
        _request(correlation_id=None),
        _request(request_id=None),
        _request(model_version=None),
        _request(flags=None),
        lambda: pb.InferenceResponse(output_tensors=None),
        lambda: pb.Tensor(None, np.zeros(1)),
        lambda: pb.Tensor("OUTPUT0", None),
        lambda: pb.Tensor("", None),
        lambda: pb.Logger.log("level", None),
        lambda: pb.Logger.log("level", 1),
        lambda: pb.Logger.log_info(None),
        lambda: pb.Logger.log_warn(None),
        lambda: pb.Logger.log_error(None),
        lambda: pb.Logger.log_verbose(None),
    ],
)
def test_a_wrong_type_is_a_type_error(call: Callable[[], object]) -> None:
    with pytest.raises(TypeError):
        call()


@pytest.mark.parametrize(
    "call",
    [
        _request(inputs=[None]),
        lambda: pb.InferenceResponse(output_tensors=[None]),
        lambda: pb.Tensor.from_dlpack("OUTPUT0", None),
        lambda: pb.Tensor.from_dlpack("", None),
    ],
)
def test_none_inside_a_list_or_no_capsule_is_a_model_exception(call: Callable[[], object]) -> None:
    with pytest.raises(pb.TritonModelException):
        call()


def test_good_arguments_pass() -> None:
    assert pb.InferenceRequest(inputs=X, model_name="m", requested_output_names=["y"],
                               correlation_id="id-5").correlation_id() == "id-5"  # fmt: skip
    assert pb.InferenceRequest(requested_output_names=[], inputs=[], model_name="m").correlation_id() == 0
    assert pb.InferenceResponse(output_tensors=[]).output_tensors() == []
    pb.Logger.log("no level given")
