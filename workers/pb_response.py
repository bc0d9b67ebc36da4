"""``pb_utils.InferenceResponse``, and the checks on the parameters a model sets on a response or on a
request it builds (``checked_parameters``).

Its own module so that both ``pb_request`` (``exec`` returns one) and ``pb_response_iterator`` (a decoupled
call's stream yields them) import it, neither importing the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from zinfer.client.protocol import MAX_NAME, MAX_TENSORS
from zinfer.client.worker_protocol import MAX_PARAMETER_TEXT

from .pb_errors import TritonError, TritonModelException
from .pb_tensor import Tensor

__all__ = ["InferenceResponse", "checked_parameters"]


class InferenceResponse:
    """The answer to one request: output tensors, or an error for that request alone; ``parameters``
    (a dict of str to bool, int or str, or its JSON text) go to the client with the response."""

    def __init__(
        self,
        output_tensors: Iterable[Tensor] = (),
        error: TritonError | str | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._tensors = list(output_tensors)  # None: TypeError, as Triton
        for t in self._tensors:  # a loop, not all(<generator>): this runs for every response
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    "InferenceResponse: output_tensors must be a list of pb_utils.Tensor"
                )
        self._error = TritonError(error) if isinstance(error, str) else error
        self._parameters = {} if parameters is None else checked_parameters(parameters, "InferenceResponse")

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


def checked_parameters(value: Mapping[str, Any] | str | None, where: str) -> dict[str, Any]:
    """Parameters a model sets, with Triton's checks and texts: a dict (or its JSON text) of str names to
    bool, int or str values (Triton refuses floats too), within zinfer's bounds."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TritonModelException(f"{where}: parameters must be a dict or its JSON text") from None
    if not isinstance(value, Mapping):
        raise TritonModelException(f"Expect None or {dict!r}, got {type(value)!r}")
    if len(value) > MAX_TENSORS:
        raise TritonModelException(f"{where}: parameters must be a dict of at most {MAX_TENSORS} entries")
    for k, v in value.items():
        if not isinstance(k, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(k)!r}")
        if not isinstance(v, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(v)!r}"
            )
        if not 0 < len(k) <= MAX_NAME:
            raise TritonModelException(f"{where}: parameter names must be 1 to {MAX_NAME} characters")
        if isinstance(v, int) and not isinstance(v, bool) and not -(1 << 63) <= v < (1 << 64):
            raise TritonModelException(f"{where}: parameter {k!r} must be a bool, a 64-bit int or a str")
        if isinstance(v, str) and len(v) > MAX_PARAMETER_TEXT:
            raise TritonModelException(
                f"{where}: parameter {k!r} must be a str of at most {MAX_PARAMETER_TEXT} characters"
            )
    return dict(value)
