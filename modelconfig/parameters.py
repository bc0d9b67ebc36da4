"""zinfer's own keys of a model's ``parameters`` map, read and checked here.

``execution_timeout_ms`` bounds how long one batch runs on an instance (a positive whole number of
milliseconds, as a string like every parameter)::

    parameters { key: "execution_timeout_ms" value: { string_value: "5000" } }

The broker enforces it (``zinfer.broker.execution_limit``); a bad value makes the model fail to load.
"""

from __future__ import annotations

from zinfer.client.errors import ConfigError

from .model_config import ModelConfig

__all__ = [
    "EXECUTION_TIMEOUT_PARAMETER",
    "execution_limit_ns",
]


EXECUTION_TIMEOUT_PARAMETER = "execution_timeout_ms"


_MAX_DIGITS = 12  # up to about 31 years: enough, and never a huge number to parse


def execution_limit_ns(config: ModelConfig) -> int | None:
    """The model's execution limit in nanoseconds, None without one; a bad value is a ConfigError."""
    raw = config.parameters.get(EXECUTION_TIMEOUT_PARAMETER)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS) or int(text) == 0:
        raise ConfigError(
            f"model '{config.name}': parameter {EXECUTION_TIMEOUT_PARAMETER} must be a positive whole "
            f"number of milliseconds, got {raw!r}"
        )
    return int(text) * 1_000_000
