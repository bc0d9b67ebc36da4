"""What an inference returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from . import dtypes
from .errors import ClientError


class InferResult:
    """The outputs of one request, by name.

    Arrays read from shared memory are views into the client's arena: they stay valid for as long as
    any array refers to them, and their slot is reused only after the last one is gone.
    """

    def __init__(
        self,
        model: str,
        version: int,
        request_id: str,
        outputs: Mapping[str, npt.NDArray[np.generic]],
        datatypes: Mapping[str, str] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_name = model
        self.model_version = version
        self.request_id = request_id
        self._outputs = dict(outputs)
        self.final = True  # False for a decoupled model's responses before its last
        self._datatypes = dict(datatypes or {})
        self.parameters: dict[str, Any] = dict(parameters or {})  # a Triton model may set them

    def as_numpy(self, name: str) -> npt.NDArray[np.generic]:
        try:
            return self._outputs[name]
        except KeyError:
            raise ClientError(f"the result has no output named {name!r}") from None

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    def get_output(self, name: str) -> dict[str, Any] | None:
        """As tritonclient's HTTP result: ``{"name", "datatype", "shape"}`` of one output, or None."""
        arr = self._outputs.get(name)
        if arr is None:
            return None
        datatype = self._datatypes.get(name) or dtypes.numpy_to_wire(arr.dtype)
        return {"name": name, "datatype": datatype, "shape": list(arr.shape)}

    def get_response(self) -> dict[str, Any]:
        """As tritonclient's HTTP result: the response without the tensor data."""
        return {
            "model_name": self.model_name,
            "model_version": str(self.model_version),
            "id": self.request_id,
            "outputs": [self.get_output(name) for name in self._outputs],
            **({"parameters": dict(self.parameters)} if self.parameters else {}),
        }

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in self._outputs.items())
        return f"InferResult(model={self.model_name!r}, version={self.model_version}, outputs=[{shapes}])"
