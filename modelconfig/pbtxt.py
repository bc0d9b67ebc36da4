"""A strict parser for the protobuf text format, as Triton's ``config.pbtxt`` files use it.

The parser knows no schema: it turns text into a generic tree that keeps the line of every field, and
``zinfer.modelconfig.model_config`` gives that tree its meaning. Accepted syntax::

    name: "add"                      # scalar field; comments run from '#' to the end of the line
    max_batch_size: 8;               # ',' or ';' may follow any field
    dynamic_batching { }             # nested message, also written 'name: { }' or 'name < >'
    dims: [ 1, -1, 0x10 ]            # a list is the same as repeating the field once per element
    input [ { name: "a" }, { name: 'b' } ]
    parameters { key: "k" value: { string_value: "v" } }   # a map entry
    kind: KIND_GPU                   # enum values and other bare words stay identifiers
    enable: true                     # bools

Strings take double or single quotes, the C escapes (``\\n``, ``\\t``, ``\\\\``, ``\\'``, ``\\"``, octal
``\\NNN``, ``\\xHH``, ``\\uXXXX``, ``\\UXXXXXXXX``) and adjacent strings are joined. Integers are decimal,
hexadecimal (``0x1F``) or octal (``017``), with an optional ``-``. Floats may end in ``f``; ``inf`` and
``nan`` stay identifiers, ``-inf`` is read as a float.

Every error is a :class:`ConfigError` whose message starts with ``<source>:<line>:``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeAlias

from zinfer.client.errors import ConfigError

__all__ = [
    "Field",
    "Ident",
    "Item",
    "ListValue",
    "Message",
    "Scalar",
    "Value",
    "config_error",
    "describe",
    "parse",
]


@dataclass(frozen=True, slots=True)
class Ident:
    """A bare word that is not ``true``/``false``: an enum value such as ``TYPE_FP32`` or ``KIND_GPU``."""

    name: str


Scalar: TypeAlias = "str | int | float | bool | Ident"


@dataclass(frozen=True, slots=True)
class Message:
    """A message block: its fields in source order, and the line where it opens."""

    fields: tuple[Field, ...]
    line: int


@dataclass(frozen=True, slots=True)
class Item:
    """One element of a ``[ ... ]`` list."""

    value: Scalar | Message
    line: int


@dataclass(frozen=True, slots=True)
class ListValue:
    """A ``[ ... ]`` list; it means the same as writing the field once per element."""

    items: tuple[Item, ...]


Value: TypeAlias = "Scalar | Message | ListValue"


@dataclass(frozen=True, slots=True)
class Field:
    """``name: value``; ``line`` is where the field name stands."""

    name: str
    value: Value
    line: int


def config_error(source: str, line: int, message: str, field: str | None = None) -> ConfigError:
    """The one error format: ``source:line: field 'name': message`` (the field part only when known)."""
    where = f"{source}:{line}" if line > 0 else source
    if field:
        return ConfigError(f"{where}: field '{field}': {message}")
    return ConfigError(f"{where}: {message}")


def describe(value: Value) -> str:
    """A value as an error message shows it."""
    if isinstance(value, Message):
        return "a message block"
    if isinstance(value, ListValue):
        return "a list"
    if isinstance(value, Ident):
        return f"'{value.name}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'the string "{escaped}"'
    return repr(value)


# ----------------------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "ident" | "string" | "number" | "punct" | "eof"
    text: str
    line: int
    value: Scalar = ""


_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+)
  | (?P<newline>\n)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*')
  | (?P<badstring>["'])
  | (?P<number>-?(?:0[xX][0-9A-Fa-f]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)(?![A-Za-z0-9_.]))
  | (?P<neginf>-(?:inf|infinity|nan)(?![A-Za-z0-9_]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}\[\]<>:,;])
    """,
    re.VERBOSE | re.IGNORECASE,
)

_BOOLS = {"true": True, "True": True, "false": False, "False": False}
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))")


def _unquote(text: str, source: str, line: int) -> str:
    """Decode a quoted string; octal and hex escapes are bytes, so the result is decoded as UTF-8."""
    body = text[1:-1]
    out = bytearray()
    pos = 0
    for match in _ESCAPE.finditer(body):
        out += body[pos : match.start()].encode("utf-8")
        octal, hexa, uni4, uni8, simple = match.groups()
        if octal is not None:
            code = int(octal, 8)
            if code > 0xFF:
                raise config_error(source, line, f"octal escape \\{octal} is out of range")
            out.append(code)
        elif hexa is not None:
            out.append(int(hexa, 16))
        elif uni4 is not None or uni8 is not None:
            code = int(uni4 or uni8, 16)
            try:
                out += chr(code).encode("utf-8")
            except (ValueError, UnicodeEncodeError):
                raise config_error(source, line, f"bad unicode escape {match.group(0)}") from None
        elif simple in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[simple].encode("utf-8")
        else:
            raise config_error(source, line, f"unknown escape sequence \\{simple} in string")
        pos = match.end()
    out += body[pos:].encode("utf-8")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise config_error(source, line, "string is not valid UTF-8 after its escapes") from None


def _number(text: str, source: str, line: int) -> int | float:
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("-")
    lower = digits.lower()
    if lower.startswith("0x"):
        return sign * int(digits[2:], 16)
    if "." in digits or "e" in lower or lower.endswith("f"):
        return sign * float(digits.rstrip("fF"))
    if len(digits) > 1 and digits.startswith("0"):
        if not all(ch in "01234567" for ch in digits):
            raise config_error(source, line, f"'{text}' is not a valid octal integer")
        return sign * int(digits, 8)
    return sign * int(digits)


def _tokenize(text: str, source: str) -> list[_Token]:
    tokens: list[_Token] = []
    line = 1
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise config_error(source, line, f"unexpected character {text[pos]!r}")
        kind = match.lastgroup or ""
        chunk = match.group()
        pos = match.end()
        if kind == "newline":
            line += 1
        elif kind == "badstring":
            raise config_error(source, line, "unterminated string")
        elif kind == "string":
            tokens.append(_Token("string", chunk, line, _unquote(chunk, source, line)))
        elif kind == "number":
            tokens.append(_Token("number", chunk, line, _number(chunk, source, line)))
        elif kind == "neginf":
            tokens.append(_Token("number", chunk, line, float(chunk.lower().replace("infinity", "inf"))))
        elif kind == "ident":
            value: Scalar = _BOOLS[chunk] if chunk in _BOOLS else Ident(chunk)
            tokens.append(_Token("ident", chunk, line, value))
        elif kind == "punct":
            tokens.append(_Token("punct", chunk, line))
    tokens.append(_Token("eof", "end of file", line))
    return tokens


# ----------------------------------------------------------------------------------------- parser

_CLOSE = {"{": "}", "<": ">"}


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self._source = source
        self._tokens = _tokenize(text, source)
        self._pos = 0

    def _peek(self) -> _Token:
        return self._tokens[self._pos]

    def _next(self) -> _Token:
        token = self._tokens[self._pos]
        if token.kind != "eof":
            self._pos += 1
        return token

    def _error(self, token: _Token, message: str, field: str | None = None) -> ConfigError:
        return config_error(self._source, token.line, message, field)

    def _shown(self, token: _Token) -> str:
        return token.text if token.kind == "eof" else f"'{token.text}'"

    def parse_top(self) -> Message:
        return Message(self._fields(None), 1)

    def _fields(self, close: str | None) -> tuple[Field, ...]:
        fields: list[Field] = []
        while True:
            token = self._peek()
            if close is None and token.kind == "eof":
                return tuple(fields)
            if close is not None and token.kind == "punct" and token.text == close:
                self._next()
                return tuple(fields)
            if token.kind == "eof":
                raise self._error(token, f"expected '{close}' before the end of the file")
            fields.append(self._field())
            sep = self._peek()
            if sep.kind == "punct" and sep.text in ",;":
                self._next()

    def _field(self) -> Field:
        token = self._next()
        if token.kind != "ident":
            raise self._error(token, f"expected a field name, got {self._shown(token)}")
        name = token.text
        colon = self._peek().kind == "punct" and self._peek().text == ":"
        if colon:
            self._next()
        start = self._peek()
        if start.kind == "punct" and start.text in _CLOSE:
            return Field(name, self._message(), token.line)
        if start.kind == "punct" and start.text == "[":
            return Field(name, self._list(name), token.line)
        if not colon:
            raise self._error(
                start, f"expected ':' or '{{' after the field name, got {self._shown(start)}", name
            )
        return Field(name, self._scalar(name), token.line)

    def _message(self) -> Message:
        opener = self._next()
        return Message(self._fields(_CLOSE[opener.text]), opener.line)

    def _list(self, name: str) -> ListValue:
        self._next()  # '['
        items: list[Item] = []
        token = self._peek()
        if token.kind == "punct" and token.text == "]":
            self._next()
            return ListValue(())
        while True:
            token = self._peek()
            if token.kind == "punct" and token.text in _CLOSE:
                items.append(Item(self._message(), token.line))
            else:
                items.append(Item(self._scalar(name), token.line))
            sep = self._next()
            if sep.kind == "punct" and sep.text == "]":
                return ListValue(tuple(items))
            if not (sep.kind == "punct" and sep.text == ","):
                raise self._error(sep, f"expected ',' or ']' in the list, got {self._shown(sep)}", name)
            after = self._peek()
            if after.kind == "punct" and after.text == "]":
                raise self._error(after, "a list may not end with ','", name)

    def _scalar(self, name: str) -> Scalar:
        token = self._next()
        if token.kind == "string":
            parts = [str(token.value)]
            while self._peek().kind == "string":
                parts.append(str(self._next().value))
            return "".join(parts)
        if token.kind in ("number", "ident"):
            return token.value
        raise self._error(token, f"expected a value, got {self._shown(token)}", name)


def parse(text: str, source: str = "<config>") -> Message:
    """Parse protobuf text into a :class:`Message` tree; ``source`` names the file in error messages."""
    return _Parser(text, source).parse_top()
