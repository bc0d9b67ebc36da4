"""The one exception tree of zinfer, shared by the client, the broker and the workers.

::

    ZinferError
    ├── ConfigError                 a model configuration or server option is invalid
    ├── ProtocolError               a message could not be encoded or decoded
    ├── ShmError                    a shared-memory segment could not be created, sized or mapped
    ├── ClientError                 raised on the client side before or after the server answered
    │   ├── ConnectionFailed        the server could not be reached
    │   └── RequestTimeout          no reply came within the timeout
    └── ServerError                 the server answered with an error status
        ├── InvalidArgument         the request is malformed or does not match the model
        │   └── UnknownRegion       a tensor names a region this connection has not registered
        ├── NotFound                unknown model, version or region
        ├── Unavailable             the model or server cannot take the request now
        ├── ResourceExhausted       a queue, arena or size limit is full
        ├── DeadlineExceeded        the request timed out in the server
        ├── Cancelled               the request was cancelled
        ├── Unsupported             the feature exists in the config surface but not yet in zinfer
        ├── AlreadyExists           the thing to create is already there
        └── InternalError           the server or the model failed
            └── UnknownError        an error of unknown kind (a Triton model's TritonError.UNKNOWN)

Every server error crosses the wire as a status code and the text ``"Class: message"``; ``from_status``
turns them back into the matching class.
"""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    UNAVAILABLE = 3
    RESOURCE_EXHAUSTED = 4
    DEADLINE_EXCEEDED = 5
    CANCELLED = 6
    UNSUPPORTED = 7
    ALREADY_EXISTS = 8
    INTERNAL = 9


class ZinferError(Exception):
    """Base of every error zinfer raises on purpose."""


class ConfigError(ZinferError):
    """A configuration file or option is invalid; the message names the file, line and field."""


class ProtocolError(ZinferError):
    """A message could not be encoded or decoded."""


class ShmError(ZinferError):
    """A shared-memory segment could not be created, sized or mapped."""


class ClientError(ZinferError):
    """Raised by the client library itself."""


class ConnectionFailed(ClientError):
    """The server could not be reached or went away."""


class RequestTimeout(ClientError):
    """No reply came within the timeout."""


class ServerError(ZinferError):
    """The server answered with an error status."""

    status: Status = Status.INTERNAL

    def wire_text(self) -> str:
        return f"{type(self).__name__}: {self}"


class InvalidArgument(ServerError):
    status = Status.INVALID_ARGUMENT


class UnknownRegion(InvalidArgument):
    """The region is not registered by this connection (after a server restart, re-register it)."""


class NotFound(ServerError):
    status = Status.NOT_FOUND


class Unavailable(ServerError):
    status = Status.UNAVAILABLE


class ResourceExhausted(ServerError):
    status = Status.RESOURCE_EXHAUSTED


class DeadlineExceeded(ServerError):
    status = Status.DEADLINE_EXCEEDED


class Cancelled(ServerError):
    status = Status.CANCELLED


class Unsupported(ServerError):
    status = Status.UNSUPPORTED


class AlreadyExists(ServerError):
    status = Status.ALREADY_EXISTS


class InternalError(ServerError):
    status = Status.INTERNAL


class UnknownError(InternalError):
    """An error of unknown kind (a Triton model's ``TritonError.UNKNOWN``): INTERNAL on zinfer's wire, gRPC
    ``UNKNOWN`` at the front door, as Triton answers it."""


_BY_STATUS: dict[Status, type[ServerError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        ResourceExhausted,
        DeadlineExceeded,
        Cancelled,
        Unsupported,
        AlreadyExists,
        InternalError,
    )
}


_SUBCLASSES: dict[str, type[ServerError]] = {c.__name__: c for c in (UnknownRegion, UnknownError)}


def from_status(status: int, text: str) -> ServerError:
    """Rebuild the exception for an error reply; ``text`` is ``"Class: message"``."""
    try:
        cls = _BY_STATUS[Status(status)]
    except ValueError:
        cls = InternalError
    named = _SUBCLASSES.get(text.partition(":")[0])
    if named is not None and issubclass(named, cls):
        cls = named
    prefix = f"{cls.__name__}: "
    message = text[len(prefix) :] if text.startswith(prefix) else text
    return cls(message)
