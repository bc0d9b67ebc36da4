"""zinfer's client library: ``from zinfer.client import Client`` (or ``AsyncClient`` for asyncio).

The dependency floor of zinfer: the wire protocol, tensor descriptors, shared memory and errors live here,
and the broker and workers build on them. ``InferInput`` and ``InferRequestedOutput`` let code written for
Triton's ``tritonclient`` run against zinfer by changing the import and the URL.

The public names load on first use (a module ``__getattr__``), so importing one submodule
(``zinfer.client.dtypes``, ``zinfer.client.errors``) does not import the whole SDK and zmq with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .client import Client
    from .curve_keys import CurveKeys
    from .errors import (
        Cancelled,
        ClientError,
        ConnectionFailed,
        InvalidArgument,
        NotFound,
        RequestTimeout,
        ServerError,
        Unavailable,
        ZinferError,
    )
    from .result import InferResult
    from .triton_compat import (
        InferenceServerException,
        InferInput,
        InferRequestedOutput,
        np_to_triton_dtype,
        triton_to_np_dtype,
    )

    InferenceServerClient = Client  # tritonclient's name for the client (``AsyncClient``: the ``aio`` one)

# each public name: (its submodule, its name there)
_PUBLIC: dict[str, tuple[str, str]] = {
    "AsyncClient": ("async_client", "AsyncClient"),
    "Cancelled": ("errors", "Cancelled"),
    "Client": ("client", "Client"),
    "ClientError": ("errors", "ClientError"),
    "ConnectionFailed": ("errors", "ConnectionFailed"),
    "CurveKeys": ("curve_keys", "CurveKeys"),
    "InferInput": ("triton_compat", "InferInput"),
    "InferRequestedOutput": ("triton_compat", "InferRequestedOutput"),
    "InferResult": ("result", "InferResult"),
    "InferenceServerClient": ("client", "Client"),
    "InferenceServerException": ("triton_compat", "InferenceServerException"),
    "InvalidArgument": ("errors", "InvalidArgument"),
    "NotFound": ("errors", "NotFound"),
    "RequestTimeout": ("errors", "RequestTimeout"),
    "ServerError": ("errors", "ServerError"),
    "Unavailable": ("errors", "Unavailable"),
    "ZinferError": ("errors", "ZinferError"),
    "np_to_triton_dtype": ("triton_compat", "np_to_triton_dtype"),
    "triton_to_np_dtype": ("triton_compat", "triton_to_np_dtype"),
}

__all__ = [
    "AsyncClient",
    "Cancelled",
    "Client",
    "ClientError",
    "ConnectionFailed",
    "CurveKeys",
    "InferInput",
    "InferRequestedOutput",
    "InferResult",
    "InferenceServerClient",
    "InferenceServerException",
    "InvalidArgument",
    "NotFound",
    "RequestTimeout",
    "ServerError",
    "Unavailable",
    "ZinferError",
    "np_to_triton_dtype",
    "triton_to_np_dtype",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its submodule on first use and kept in the package from then on."""
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = where
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
