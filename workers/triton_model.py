"""A Triton-style ``TritonPythonModel`` behind the :class:`RequestModel` interface.

The worker hands ``execute`` one ``pb_utils.InferenceRequest`` per client request (each with its own
slice of the batch; nothing is concatenated) and expects one ``pb_utils.InferenceResponse`` per request,
in order. A request of a sequence carries its control inputs (START, END, READY, CORRID as the config names
them) among its input tensors, and its ``correlation_id()`` and ``flags()`` as in Triton. A response that
carries an error fails that request alone, with the error's message and a status from its code; an
exception raised by ``execute`` fails the whole batch, and so does a wrong number of responses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zinfer.client.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    ServerError,
    Unavailable,
    Unsupported,
)
from zinfer.modelconfig.model_config import ModelConfig

from . import triton_python_backend_utils as pb
from .device import Device
from .model import RequestInputs, RequestModel, RequestResult

_ERROR_BY_CODE: dict[int, type[ServerError]] = {
    pb.TritonError.NOT_FOUND: NotFound,
    pb.TritonError.INVALID_ARG: InvalidArgument,
    pb.TritonError.UNAVAILABLE: Unavailable,
    pb.TritonError.UNSUPPORTED: Unsupported,
    pb.TritonError.ALREADY_EXISTS: AlreadyExists,
    pb.TritonError.CANCELLED: Cancelled,
}


def initialize_args(config: ModelConfig, version_dir: Path, device: Device, instance: int) -> dict[str, str]:
    """The ``args`` of ``TritonPythonModel.initialize``, as Triton passes them (every value a string)."""
    return {
        "model_config": json.dumps(config.to_dict()),
        "model_instance_kind": device.kind,
        "model_instance_name": f"{config.name}_{instance}",
        "model_instance_device_id": str(device.id),
        "model_repository": str(version_dir.parent),
        "model_version": version_dir.name,
        "model_name": config.name,
    }


def response_error(error: Any) -> ServerError:
    """The status and message a ``TritonError`` (or anything else given as an error) becomes."""
    if isinstance(error, pb.TritonError):
        return _ERROR_BY_CODE.get(error.code(), InternalError)(error.message())
    message = getattr(error, "message", None)
    return InternalError(str(message() if callable(message) else error))


def _sequence_fields(sequence: Mapping[str, Any] | None) -> dict[str, Any]:
    """``correlation_id`` and ``flags`` of a sequence request, as Triton sets them (none otherwise)."""
    if sequence is None:
        return {}
    flags = pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if sequence.get("start") else 0
    if sequence.get("end"):
        flags |= pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    return {"correlation_id": sequence.get("id", 0), "flags": flags}


class TritonModel(RequestModel):
    def __init__(self, instance: Any, path: Path, config: ModelConfig) -> None:
        self.instance = instance
        self.path = path
        self.name = config.name

    def execute_requests(self, requests: Sequence[RequestInputs], /) -> Sequence[RequestResult]:
        pb_requests = [
            pb.InferenceRequest(
                inputs=[pb.Tensor(name, array) for name, array in r.inputs.items()],
                request_id=r.request_id,
                requested_output_names=r.outputs,
                model_name=self.name,
                **_sequence_fields(r.sequence),
            )
            for r in requests
        ]
        responses = self.instance.execute(pb_requests)
        if responses is None:
            raise InternalError(
                "TritonPythonModel.execute returned None: it must return a list with one InferenceResponse "
                "per request (decoupled models are not supported yet)"
            )
        try:
            responses = list(responses)
        except TypeError:
            raise InternalError(
                f"TritonPythonModel.execute returned {type(responses).__name__}: "
                "it must return a list with one InferenceResponse per request"
            ) from None
        if len(responses) != len(requests):
            raise InternalError(
                f"TritonPythonModel.execute returned {len(responses)} responses for {len(requests)} "
                "requests: it must return exactly one InferenceResponse per request, in order"
            )
        return [self._result(r) for r in responses]

    def _result(self, response: Any) -> RequestResult:
        if not isinstance(response, pb.InferenceResponse):
            return InternalError(
                f"TritonPythonModel.execute returned a {type(response).__name__} where an "
                "InferenceResponse was expected"
            )
        if response.has_error():
            return response_error(response.error())
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def finalize(self) -> None:
        finalize = getattr(self.instance, "finalize", None)
        if finalize is not None:
            finalize()
