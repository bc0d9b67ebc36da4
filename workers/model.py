"""What a worker runs: the two shapes of model and the records they exchange with the batch runner.

- :class:`Model` takes the whole batch as arrays by input name (leading batch dimension when the model
  batches) and returns the whole batch of outputs. Built-in kernels and native Python models are Models.
- :class:`RequestModel` takes the batch as separate requests and answers each one, an error or its
  outputs; Triton-style ``TritonPythonModel`` classes run behind one (no concatenation is needed, and
  one request's error reaches only its own client).

Array values are NumPy arrays, or CuPy arrays on GPU instances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from zinfer.client.errors import ServerError

from .cancel_flags import CancelFlag

Array: TypeAlias = npt.NDArray[Any]  # an alias also where the build runs mypyc without NumPy installed
Alloc = Callable[[str, tuple[int, ...], np.dtype[Any]], Array | None]


def no_alloc(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array | None:
    return None


class Model(Protocol):
    """The whole batch in, the whole batch out, by tensor name.

    A model whose ``writes_into_slots`` is true also takes an ``alloc(name, shape, dtype)`` callback: for a
    lone request it returns an array over that request's output slot in shared memory (or None), so the
    model can write its result in place and no scatter copy follows.
    """

    def execute(self, inputs: Mapping[str, Array], /) -> Mapping[str, Array]: ...

    def finalize(self) -> None: ...


class RequestInputs(NamedTuple):
    """One request as a :class:`RequestModel` sees it: its own inputs, never concatenated with others."""

    request_id: str
    inputs: dict[str, Array]
    outputs: tuple[str, ...]  # the output names the client asked for
    sequence: Mapping[str, Any] | None = None  # a sequence request: its id, start and end (and controls)
    parameters: Mapping[str, Any] | None = None  # the client's request parameters
    cancelled: CancelFlag | None = None  # set by the worker when the client cancels the request


class RequestOutputs(dict[str, Array]):
    """A request's outputs, with the parameters of its response (a Triton model's), which go to the client."""

    def __init__(self, outputs: Mapping[str, Array], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(outputs)
        self.parameters: Mapping[str, Any] = dict(parameters or {})


RequestResult = Mapping[str, Array] | ServerError


class RequestModel:
    """Base of models that answer request by request: one result per request, in order.

    A :class:`ServerError` result fails that request alone; an exception raised by ``execute_requests``
    fails the whole batch.
    """

    def execute_requests(self, requests: Sequence[RequestInputs], /) -> Sequence[RequestResult]:
        raise NotImplementedError

    def finalize(self) -> None:
        pass


AnyModel = Model | RequestModel
