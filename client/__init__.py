"""zinfer's client library: ``from zinfer.client import Client`` (or ``AsyncClient`` for asyncio).

The dependency floor of zinfer: the wire protocol, tensor descriptors, shared memory and errors live here,
and the broker and workers build on them. ``InferInput`` and ``InferRequestedOutput`` let code written for
Triton's ``tritonclient`` run against zinfer by changing the import and the URL.
"""

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

InferenceServerClient = Client
"""tritonclient's name for the client (``AsyncClient`` stands for the ``aio`` one)."""

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
