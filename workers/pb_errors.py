"""The errors of ``triton_python_backend_utils``: ``TritonError`` (a value a response carries) and
``TritonModelException`` (raised), with Triton's error codes and the zinfer status each code becomes."""

from __future__ import annotations

from zinfer.client.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    RequestTimeout,
    ServerError,
    Unavailable,
    UnknownError,
    Unsupported,
)


class TritonModelException(Exception):
    """Raised by model code (or by this API on misuse); from ``execute`` it fails the whole batch."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ArgumentTypeError(TritonModelException, TypeError):
    """An argument of the wrong type given to this API (``None`` for a name, ...): a ``TypeError`` as
    Triton's bindings raise, and a ``TritonModelException`` as zinfer raised before."""


class TritonError(Exception):
    """An error for one response: ``InferenceResponse(error=TritonError("message", TritonError.NOT_FOUND))``.
    The code (default ``INTERNAL``, as in Triton) decides the status the client sees."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str = "", code: int = INTERNAL) -> None:
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 7:
            raise TritonModelException(
                f"TritonError: unknown error code {code!r} (use TritonError.UNKNOWN .. TritonError.CANCELLED)"
            )
        super().__init__(message)
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message


_ERROR_BY_CODE: dict[int, type[ServerError]] = {
    TritonError.UNKNOWN: UnknownError,
    TritonError.NOT_FOUND: NotFound,
    TritonError.INVALID_ARG: InvalidArgument,
    TritonError.UNAVAILABLE: Unavailable,
    TritonError.UNSUPPORTED: Unsupported,
    TritonError.ALREADY_EXISTS: AlreadyExists,
    TritonError.CANCELLED: Cancelled,
}
_CODE_BY_ERROR = {cls: code for code, cls in _ERROR_BY_CODE.items()}  # UnknownError before InternalError


def server_error(error: object) -> ServerError:
    """The zinfer error (status and message) a ``TritonError``, or anything given as an error, becomes:
    INTERNAL is InternalError, UNKNOWN UnknownError (gRPC UNKNOWN at the front door), the others their
    namesakes."""
    if isinstance(error, TritonError):
        return _ERROR_BY_CODE.get(error.code(), InternalError)(error.message())
    message = getattr(error, "message", None)
    return InternalError(str(message() if callable(message) else error))


def triton_error(exc: BaseException) -> TritonError:
    """The ``TritonError`` a BLS call's failure comes back as (its code from the zinfer error's class). A
    call past its ``timeout`` gets Triton's answer to an expired request: ``Request timeout expired``,
    ``UNAVAILABLE``."""
    if isinstance(exc, RequestTimeout):
        return TritonError("Request timeout expired", TritonError.UNAVAILABLE)
    code = next((c for cls, c in _CODE_BY_ERROR.items() if isinstance(exc, cls)), TritonError.INTERNAL)
    return TritonError(f"{type(exc).__name__}: {exc}", code)
