"""A model config given as JSON (Triton's load override, ``load_model(name, config=...)``) as pbtxt text.

Triton takes the ``ModelConfig`` message in protobuf's JSON form; zinfer parses config.pbtxt strictly, so
the JSON is written out as that text and then read like any config.pbtxt (same checks, same errors).
Objects become ``field { ... }``, lists repeated entries, a ``parameters`` map Triton's ``key``/``value``
entries; strings of the enum fields (``data_type: TYPE_FP32``) go unquoted, every other string quoted.
"""

from __future__ import annotations

import json
from typing import Any

from zinfer.client.errors import ConfigError

__all__ = ["pbtxt_from_json"]

# fields whose values are enum names in Triton's ModelConfig (written unquoted)
_ENUM_FIELDS = frozenset({"data_type", "kind", "format", "timeout_action", "priority", "type"})
# fields that are maps in Triton's ModelConfig (protobuf JSON writes them as objects)
_TEXT_FIELDS = frozenset({"name", "key", "string_value", "backend", "platform", "runtime"})
_MAP_FIELDS = frozenset({"parameters", "input_map", "output_map", "cc_model_filenames", "metric_tags"})


def pbtxt_from_json(text: str, source: str = "config") -> str:
    """The config.pbtxt text of a JSON model config; a ConfigError if it is not a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: the config is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: the config must be a JSON object")
    lines: list[str] = []
    _fields(value, lines, 0, source)
    return "\n".join(lines) + "\n"


def _fields(obj: dict[str, Any], lines: list[str], depth: int, source: str) -> None:
    for key, value in obj.items():
        if not isinstance(key, str) or not key.replace("_", "").isalnum():
            raise ConfigError(f"{source}: {key!r} is not a config field name")
        items = value if isinstance(value, list) else [value]
        for item in items:
            if key in _MAP_FIELDS and isinstance(item, dict):
                for k, v in item.items():
                    _field(key, {"key": k, "value": v}, lines, depth, source)
            else:
                _field(key, item, lines, depth, source)


def _field(key: str, value: Any, lines: list[str], depth: int, source: str) -> None:
    pad = "  " * depth
    if isinstance(value, dict):
        lines.append(f"{pad}{key} {{")
        _fields(value, lines, depth + 1, source)
        lines.append(f"{pad}}}")
    elif isinstance(value, bool):
        lines.append(f"{pad}{key}: {'true' if value else 'false'}")
    elif isinstance(value, int | float):
        lines.append(f"{pad}{key}: {value!r}")
    elif isinstance(value, str):
        if key in _ENUM_FIELDS and value.replace("_", "").isalnum():
            lines.append(f"{pad}{key}: {value}")
        elif value.lstrip("-").isdigit() and key not in _TEXT_FIELDS:
            lines.append(f"{pad}{key}: {value}")  # protobuf JSON writes 64-bit integers as strings
        else:
            lines.append(f"{pad}{key}: {json.dumps(value, ensure_ascii=False)}")
    elif value is None:
        return
    else:
        raise ConfigError(f"{source}: field {key!r} has a value of type {type(value).__name__}")
