"""A typed, strict view of one pbtxt message block, used to build the config records.

A :class:`Block` hands out its fields by name and type (``string``, ``integer``, ``enum``, ``block``,
``integers``, maps, ...) and remembers which names were asked for; :meth:`Block.finish` then rejects any
field nobody asked for, so an unknown or misspelt field is always an error. A singular field given twice,
a list given to a singular field, a value of the wrong type and an integer out of its protobuf range are
errors too. Every error names the file, the line and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from enum import Enum
from typing import TypeVar

from zinfer.client.dtypes import CONFIG_TYPES
from zinfer.client.errors import ConfigError

from .pbtxt import Field, Ident, ListValue, Message, Scalar, Value, config_error, describe

__all__ = [
    "INT32",
    "INT64",
    "UINT32",
    "UINT64",
    "Block",
    "dim_check",
    "nonnegative",
    "read_dims",
    "optional_block",
    "required_block",
    "required_string",
    "required_strings",
]

E = TypeVar("E", bound=Enum)
T = TypeVar("T")
K = TypeVar("K", str, int)

INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)

_FLOAT_WORDS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}


class Block:
    """One message block of a config, read field by field; see the module docstring."""

    def __init__(self, message: Message, source: str) -> None:
        self.message = message
        self.source = source
        self._by_name: dict[str, list[Field]] = {}
        for field in message.fields:
            self._by_name.setdefault(field.name, []).append(field)
        self._asked: set[str] = set()

    @property
    def line(self) -> int:
        return self.message.line

    def error(self, message: str, field: str | None = None, line: int | None = None) -> ConfigError:
        """A :class:`ConfigError` at ``line`` (default: the line of ``field``, else of the block)."""
        if line is None:
            line = self.field_line(field) if field else self.line
        return config_error(self.source, line, message, field)

    def field_line(self, name: str) -> int:
        fields = self._by_name.get(name)
        return fields[0].line if fields else self.line

    def has(self, name: str) -> bool:
        """Whether the field is written at all (an empty list counts)."""
        return name in self._by_name

    def names(self) -> list[str]:
        """The names of the fields written, in source order, each once."""
        return list(self._by_name)

    def oneof(self, *names: str) -> str | None:
        """The one name of ``names`` that is written, or ``None``; two of them is an error."""
        given = [name for name in names if name in self._by_name]
        if len(given) > 1:
            choices = ", ".join(names)
            raise self.error(f"only one of {choices} may be given, not also '{given[0]}'", given[1])
        return given[0] if given else None

    def finish(self) -> None:
        """Reject every field that no accessor asked for."""
        for field in self.message.fields:
            if field.name not in self._asked:
                raise config_error(self.source, field.line, "unknown field", field.name)

    # ------------------------------------------------------------------ raw access

    def _single(self, name: str) -> Field | None:
        self._asked.add(name)
        fields = self._by_name.get(name)
        if not fields:
            return None
        if len(fields) > 1:
            raise config_error(self.source, fields[1].line, "given more than once", name)
        if isinstance(fields[0].value, ListValue):
            raise config_error(self.source, fields[0].line, "takes one value, not a list", name)
        return fields[0]

    def _items(self, name: str) -> Iterator[tuple[Scalar | Message, int]]:
        self._asked.add(name)
        for field in self._by_name.get(name, ()):
            if isinstance(field.value, ListValue):
                for item in field.value.items:
                    yield item.value, item.line
            else:
                yield field.value, field.line

    # ------------------------------------------------------------------ value conversion

    def _bad(self, name: str, line: int, what: str, value: Value) -> ConfigError:
        return config_error(self.source, line, f"expected {what}, got {describe(value)}", name)

    def _as_int(self, name: str, value: Value, line: int, bounds: tuple[int, int]) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, line, "an integer", value)
        low, high = bounds
        if not low <= value <= high:
            raise config_error(self.source, line, f"{value} is out of range [{low}, {high}]", name)
        return value

    def _as_string(self, name: str, value: Value, line: int) -> str:
        if not isinstance(value, str):
            raise self._bad(name, line, "a quoted string", value)
        return value

    def _as_bool(self, name: str, value: Value, line: int) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, Ident) and value.name in ("t", "f"):
            return value.name == "t"
        raise self._bad(name, line, "true or false", value)

    def _as_float(self, name: str, value: Value, line: int) -> float:
        if isinstance(value, Ident) and value.name.lower() in _FLOAT_WORDS:
            return _FLOAT_WORDS[value.name.lower()]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(name, line, "a number", value)
        return float(value)

    def _as_word(self, name: str, value: Value, line: int, allowed: Collection[str]) -> str:
        if not isinstance(value, Ident) or value.name not in allowed:
            choices = ", ".join(sorted(allowed))
            raise self._bad(name, line, f"one of {choices}", value)
        return value.name

    def _as_block(self, name: str, value: Value, line: int) -> Block:
        if not isinstance(value, Message):
            raise self._bad(name, line, "a message block '{ ... }'", value)
        return Block(value, self.source)

    # ------------------------------------------------------------------ singular fields

    def string(self, name: str, default: str = "") -> str:
        field = self._single(name)
        return default if field is None else self._as_string(name, field.value, field.line)

    def integer(self, name: str, bounds: tuple[int, int], default: int = 0) -> int:
        field = self._single(name)
        return default if field is None else self._as_int(name, field.value, field.line, bounds)

    def boolean(self, name: str, default: bool = False) -> bool:
        field = self._single(name)
        return default if field is None else self._as_bool(name, field.value, field.line)

    def real(self, name: str, default: float = 0.0) -> float:
        field = self._single(name)
        return default if field is None else self._as_float(name, field.value, field.line)

    def enum(self, name: str, kind: type[E], default: E) -> E:
        """An enum field written as a bare identifier; ``kind``'s member names are the allowed words."""
        field = self._single(name)
        if field is None:
            return default
        return kind[self._as_word(name, field.value, field.line, kind.__members__)]

    def data_type(self, name: str = "data_type", *, required: bool = True) -> str:
        """A ``TYPE_*`` data type from ``CONFIG_TYPES``; ``""`` when absent and not required."""
        field = self._single(name)
        if field is None:
            if required:
                raise self.error("is required (one of TYPE_FP32, TYPE_INT64, TYPE_STRING, ...)", name)
            return ""
        return self._as_word(name, field.value, field.line, CONFIG_TYPES)

    def block(self, name: str) -> Block | None:
        field = self._single(name)
        return None if field is None else self._as_block(name, field.value, field.line)

    # ------------------------------------------------------------------ repeated fields

    def integers(
        self, name: str, bounds: tuple[int, int], check: Callable[[int], str | None] | None = None
    ) -> tuple[int, ...]:
        """A repeated integer; ``check(value)`` may return an error message for one element."""
        out: list[int] = []
        for value, line in self._items(name):
            number = self._as_int(name, value, line, bounds)
            problem = check(number) if check is not None else None
            if problem:
                raise config_error(self.source, line, problem, name)
            out.append(number)
        return tuple(out)

    def strings(self, name: str) -> tuple[str, ...]:
        return tuple(self._as_string(name, value, line) for value, line in self._items(name))

    def booleans(self, name: str) -> tuple[bool, ...]:
        return tuple(self._as_bool(name, value, line) for value, line in self._items(name))

    def reals(self, name: str) -> tuple[float, ...]:
        return tuple(self._as_float(name, value, line) for value, line in self._items(name))

    def blocks(self, name: str) -> list[Block]:
        return [self._as_block(name, value, line) for value, line in self._items(name)]

    def map(
        self, name: str, key: type[K], read: Callable[[Block, str], T], default: T | None = None
    ) -> dict[K, T]:
        """A protobuf map written as repeated ``name { key: ... value: ... }`` entries.

        ``key`` is ``str`` or ``int`` (uint64 keys); ``read(entry, "value")`` reads the value of one entry
        and ``default`` stands for an entry without ``value`` (without a default, ``value`` is required).
        A key given twice is an error.
        """
        out: dict[K, T] = {}
        for entry in self.blocks(name):
            k = key(entry.string("key")) if key is str else key(entry.integer("key", UINT64))
            found = read(entry, "value") if entry.has("value") else default
            entry._asked.add("value")
            entry.finish()
            if found is None:
                raise entry.error("every map entry needs a 'value'", name)
            value: T = found
            if k in out:
                raise config_error(self.source, entry.field_line("key"), f"key {k!r} given twice", name)
            out[k] = value
        return out

    def string_map(self, name: str) -> dict[str, str]:
        """A ``map<string, string>``."""
        return self.map(name, str, lambda entry, field: entry.string(field), "")


# ------------------------------------------------------------------ shared checks


def required_block(b: Block, name: str) -> Block:
    block = b.block(name)
    if block is None:
        raise b.error("is required", name)
    return block


def required_string(b: Block, name: str) -> str:
    value = b.string(name)
    if not value:
        raise b.error("is required and may not be empty", name)
    return value


def required_strings(b: Block, name: str) -> tuple[str, ...]:
    """A repeated string field that must list at least one value."""
    values = b.strings(name)
    if not values:
        raise b.error("is required", name)
    return values


def optional_block(b: Block, name: str, decode: Callable[[Block], T], default: T) -> T:
    """``decode`` applied to the sub-block ``name`` (then checked for unknown fields), or ``default``
    when the config leaves the block out."""
    block = b.block(name)
    if block is None:
        return default
    record = decode(block)
    block.finish()
    return record


def dim_check(value: int) -> str | None:
    if value >= 1 or value == -1:
        return None
    return f"a dimension must be >= 1, or -1 for a variable size, got {value}"


def nonnegative(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def read_dims(b: Block, name: str = "dims", *, required: bool = True) -> tuple[int, ...]:
    dims = b.integers(name, INT64, dim_check)
    if required and not dims:
        raise b.error("is required and may not be empty", name)
    return dims
