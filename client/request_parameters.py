"""A request's parameters as the clients send them: the user's own (checked: string names; bool, number or
string values) and Triton's sequence parameters (``sequence_id``, ``sequence_start``, ``sequence_end``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ClientError

__all__ = ["sequence_parameters", "user_parameters"]


def user_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A request's parameters, checked: names are strings, values booleans, numbers or strings."""
    if not parameters:
        return {}
    if not isinstance(parameters, Mapping):
        raise ClientError(f"parameters must be a dict, got {type(parameters).__name__}")
    for key, value in parameters.items():
        if not isinstance(key, str) or not key:
            raise ClientError(f"parameter names must be non-empty strings, got {key!r}")
        if not isinstance(value, bool | int | float | str):
            kind = type(value).__name__
            raise ClientError(f"parameter {key!r} must be a bool, int, float or str, got {kind}")
    return dict(parameters)


def sequence_parameters(sequence_id: int | str, start: bool, end: bool) -> dict[str, Any]:
    """Triton's sequence request parameters; none for a request outside any sequence."""
    if sequence_id in (0, "") and not start and not end:
        return {}
    return {"sequence_id": sequence_id, "sequence_start": bool(start), "sequence_end": bool(end)}
