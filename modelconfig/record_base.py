"""What the config records of every group share: the enum base, read-only maps and the JSON form.

Enums derive from :class:`ProtoEnum`; their values are the protobuf names, so
``InstanceKind("KIND_GPU") is InstanceKind.KIND_GPU`` and ``InstanceKind.KIND_GPU == "KIND_GPU"``.
``record_to_dict`` turns a record into Triton's JSON form, guided by ``json_meta`` field metadata (a
different JSON key, or ``{wrap: value}`` nesting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

__all__ = ["ProtoEnum", "empty_map", "frozen_map", "json_meta", "record_to_dict"]

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def empty_map() -> Mapping[Any, Any]:
    """The shared empty read-only mapping (a ``default_factory`` for mapping fields)."""
    return _EMPTY


def frozen_map(items: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only view of a copy of ``items``, for the mapping fields of the records."""
    return MappingProxyType(dict(items))


def json_meta(name: str | None = None, wrap: str | None = None, wrap_values: str | None = None) -> Any:
    """Field metadata for :func:`record_to_dict`: JSON key, and ``{wrap: value}`` nesting."""
    return {"json": name, "wrap": wrap, "wrap_values": wrap_values}


def _plain(value: Any, wrap_values: str | None = None) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return to_dict() if to_dict is not None else record_to_dict(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): {wrap_values: _plain(v)} if wrap_values else _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def record_to_dict(record: Any) -> dict[str, Any]:
    """Triton's JSON form of a record: every field, ``None`` left out, enums by name."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None:
            continue
        meta = f.metadata
        plain = _plain(value, meta.get("wrap_values"))
        out[meta.get("json") or f.name] = {meta["wrap"]: plain} if meta.get("wrap") else plain
    return out


class ProtoEnum(str, Enum):
    """An enum whose values are the protobuf names, so ``Kind("KIND_GPU") is Kind.KIND_GPU``; it prints as
    that name (``KIND_GPU``, not ``InstanceKind.KIND_GPU``) in messages, as Triton writes it."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
