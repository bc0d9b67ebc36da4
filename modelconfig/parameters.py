"""zinfer's own keys of a model's ``parameters`` map, read and checked here.

``zinfer_early_dispatch`` (``"true"``, the default, or ``"false"``) says whether the dynamic batcher may
send a batch before ``max_queue_delay_microseconds`` when no other request is due within it
(``zinfer.broker.batching.early_dispatch``); ``"false"`` keeps Triton's timing exactly::

    parameters { key: "zinfer_early_dispatch" value: { string_value: "false" } }

``execution_timeout_ms`` bounds how long one batch runs on an instance (a positive whole number of
milliseconds, as a string like every parameter)::

    parameters { key: "execution_timeout_ms" value: { string_value: "5000" } }

The broker enforces it (``zinfer.broker.execution_limit``); a bad value makes the model fail to load.

Triton's python backend reads ``EXECUTION_ENV_PATH``: a conda-pack tarball it unpacks and whose Python
runs the model. zinfer runs every python model in the server's own environment, so a model that names
one is refused at load with that reason (``check_parameters``) rather than run in the wrong environment.

An ONNX model's ONNX Runtime keys (``intra_op_thread_count`` and the rest) are checked here too, through
``onnx_options.onnx_session_options``.
"""

from __future__ import annotations

from zinfer.client.errors import ConfigError

from .autocomplete import is_onnx
from .model_config import ModelConfig
from .onnx_options import onnx_session_options

__all__ = [
    "EXECUTION_ENV_PARAMETER",
    "EARLY_DISPATCH_PARAMETER",
    "EXECUTION_TIMEOUT_PARAMETER",
    "check_parameters",
    "early_dispatch",
    "execution_limit_ns",
]


EXECUTION_TIMEOUT_PARAMETER = "execution_timeout_ms"
EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
EARLY_DISPATCH_PARAMETER = "zinfer_early_dispatch"
_BOOLEANS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}


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


def early_dispatch(config: ModelConfig) -> bool:
    """Whether the model's batcher may send before its queue delay (default yes); a bad value is a
    ConfigError."""
    raw = config.parameters.get(EARLY_DISPATCH_PARAMETER)
    if raw is None:
        return True
    value = _BOOLEANS.get(raw.strip().lower())
    if value is None:
        raise ConfigError(
            f'model \'{config.name}\': parameter {EARLY_DISPATCH_PARAMETER} must be "true" or "false" '
            "(or 1/0, yes/no, on/off), "
            f"got {raw!r}"
        )
    return value


def check_parameters(config: ModelConfig) -> None:
    """Raise a ConfigError for a parameter zinfer cannot honour, or a bad value of one of its own."""
    env = config.parameters.get(EXECUTION_ENV_PARAMETER)
    if env is not None:
        raise ConfigError(
            f"model '{config.name}': parameter {EXECUTION_ENV_PARAMETER} ({env!r}) is not supported: "
            "zinfer does not unpack conda-pack environments; it runs python models in the server's own "
            "Python environment, so install the packages the model needs there and remove the parameter"
        )
    execution_limit_ns(config)
    early_dispatch(config)
    if is_onnx(config):
        onnx_session_options(config)
