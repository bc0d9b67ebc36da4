"""zinfer's client library: ``from zinfer.client import Client``.

The dependency floor of zinfer: the wire protocol, tensor descriptors, shared memory and errors live here,
and the broker and workers build on them.
"""

from .client import Client
from .connection import CurveKeys
from .errors import (
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

__all__ = [
    "Client",
    "ClientError",
    "ConnectionFailed",
    "CurveKeys",
    "InferResult",
    "InvalidArgument",
    "NotFound",
    "RequestTimeout",
    "ServerError",
    "Unavailable",
    "ZinferError",
]
