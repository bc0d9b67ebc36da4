"""Business logic scripting: a model's ``execute`` calling other models through the broker.

The worker is then a client of its own server: a ``zinfer.client.Client`` on the server's socket, made on
first use, tensors through its own shared-memory arena (``bls_link.BlsLink``, held by the worker's
runtime). Native models call ``infer`` / ``infer_async``;
Triton-style models use ``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()``, which return errors as
values the way Triton does.

A model calling itself can wait for itself forever: with one instance (the caller) that is certain, so it
is refused at once; with more, every call has a timeout (``BLS_TIMEOUT_S``), so a circle of instances all
waiting on each other ends in a clear error, never a silent deadlock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .bls_link import BLS_TIMEOUT_S as BLS_TIMEOUT_S
from .bls_link import BlsLink
from .runtime import current


def _link() -> BlsLink:
    return current().bls


def configure(url: str | None, model: str, instances: int) -> None:
    """Where the server is, and who is calling (the worker runtime's link; the worker sets it itself)."""
    _link().configure(url, model, instances)


def infer(
    model: str,
    inputs: Mapping[str, npt.ArrayLike],
    outputs: Sequence[str] | None = None,
    model_version: int = 0,
    timeout_s: float = BLS_TIMEOUT_S,
    **options: Any,
) -> dict[str, npt.NDArray[Any]]:
    """Run ``model`` on ``inputs`` through the server and return its outputs (raises zinfer errors).
    ``options`` go to ``Client.infer`` (``parameters``, ``sequence_id``, ``sequence_start``, ...)."""
    return infer_with_parameters(model, inputs, outputs, model_version, timeout_s, **options)[0]


def infer_with_parameters(
    model: str,
    inputs: Mapping[str, npt.ArrayLike],
    outputs: Sequence[str] | None = None,
    model_version: int = 0,
    timeout_s: float = BLS_TIMEOUT_S,
    **options: Any,
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
    """``infer``, with the response's parameters (a Triton model's) beside its outputs."""
    link = _link()
    link.check_self_call(model)
    result = link.connection().infer(model, inputs, outputs=outputs, model_version=model_version,
                                 client_timeout=timeout_s, **options)  # fmt: skip
    return {name: np.array(result.as_numpy(name)) for name in result.output_names}, dict(result.parameters)


def stream(
    model: str,
    inputs: Mapping[str, npt.ArrayLike],
    outputs: Sequence[str] | None = None,
    model_version: int = 0,
    timeout_s: float = BLS_TIMEOUT_S,
    parameters: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> Iterator[tuple[dict[str, npt.NDArray[Any]], bool, dict[str, Any]]]:
    """The responses of a decoupled ``model`` to one request, as they come: ``(outputs, final,
    parameters)`` each; ``timeout_s`` bounds the wait for each response (raises zinfer errors).
    ``request_id`` lets :func:`cancel` reach the request while it streams."""
    link = _link()
    link.check_self_call(model)
    for result in link.connection().stream(model, inputs, outputs=outputs, model_version=model_version,
                                       client_timeout=timeout_s, parameters=parameters,
                                       request_id=request_id):  # fmt: skip
        outs = {name: np.array(result.as_numpy(name)) for name in result.output_names}
        yield outs, result.final, dict(result.parameters)


def cancel(request_id: str) -> bool:
    """Cancel the call in flight with this ``request_id`` (the model it calls sees ``is_cancelled()``);
    False when none is."""
    return _link().connection().cancel(request_id)


async def infer_async(
    model: str,
    inputs: Mapping[str, npt.ArrayLike],
    outputs: Sequence[str] | None = None,
    model_version: int = 0,
    timeout_s: float = BLS_TIMEOUT_S,
) -> dict[str, npt.NDArray[Any]]:
    """``infer`` without blocking an event loop (several calls may run at once)."""
    return await asyncio.to_thread(infer, model, inputs, outputs, model_version, timeout_s)


def load_model(name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
    """Load ``name`` in the server (explicit model control), as Triton's ``pb_utils.load_model``: with a
    ``config`` (JSON) and ``files`` to override, if given."""
    _link().connection().load_model(name, config=config or None, files=files)


def unload_model(name: str) -> None:
    _link().connection().unload_model(name)


def is_model_ready(name: str, version: int | str = 0) -> bool:
    return _link().connection().is_model_ready(name, version)
