"""The server's configuration file: ``zinfer serve --config FILE`` reads every server option from TOML.

Keys are flat (two are tables: ``rate_limit_resources`` and ``cpu_affinity``) and named like the fields of
``ServerOptions``. Validation happens here, at the edge: an unknown key, a value of the wrong type or out
of range is a :class:`ConfigFileError` naming the file and the key. Relative paths are taken from the
file's folder. Command-line flags override the file (``cli.py`` puts the file's values under the flags as
their defaults); keys without a flag can only be set here. ``configs/zinfer.toml`` is the commented
example with every key.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .memory_budget import parse_budget

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser as the tomli package, where it is installed
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MODEL_CONTROL_MODES = ("none", "explicit", "on-demand")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_CPU = 1 << 16


class ConfigFileError(ValueError):
    """A configuration file that cannot be used; the message names the file and, when there is one, the
    key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


class _Bad(Exception):
    """Raised by a converter: what was expected."""


# ---------------------------------------------------------------------------------------- converters


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "a table" if isinstance(value, dict) else "an array"
    return repr(value)


def _text(value: object, _base: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad("a non-empty string")
    return value


def _path(value: object, base: Path) -> Path:
    text = _text(value, base)
    path = Path(text)
    return path if path.is_absolute() else base / path


def host_port(value: str) -> str:
    """``HOST:PORT`` with a port in 0..65535; raises ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def _address(value: object, base: Path) -> str:
    try:
        return host_port(_text(value, base))
    except (ValueError, _Bad):
        raise _Bad('"HOST:PORT" with a port in 0..65535') from None


def _metrics(value: object, base: Path) -> str:
    if value == "off":
        return "off"
    try:
        return _address(value, base)
    except _Bad:
        raise _Bad('"HOST:PORT" or "off"') from None


def _flag(value: object, _base: Path) -> bool:
    if not isinstance(value, bool):
        raise _Bad("true or false")
    return value


def _integer(minimum: int) -> Callable[[object, Path], int]:
    def convert(value: object, _base: Path) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Bad(f"an integer >= {minimum}")
        return value

    return convert


def _seconds(positive: bool) -> Callable[[object, Path], float]:
    def convert(value: object, _base: Path) -> float:
        expected = "a number of seconds " + ("> 0" if positive else ">= 0")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Bad(expected)
        if value < 0 or (positive and value == 0):
            raise _Bad(expected)
        return float(value)

    return convert


def _choice(choices: tuple[str, ...], fold: Callable[[str], str]) -> Callable[[object, Path], str]:
    def convert(value: object, _base: Path) -> str:
        if isinstance(value, str) and fold(value) in choices:
            return fold(value)
        raise _Bad("one of " + ", ".join(f'"{c}"' for c in choices))

    return convert


def _model_names(value: object, _base: Path) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Bad('an array of model names ("*": all)')
    for item in value:
        if not isinstance(item, str) or not (item == "*" or _MODEL_NAME.fullmatch(item)):
            raise _Bad(f'an array of model names ("*": all); {_describe(item)} is not one')
    return tuple(value)


def _budget(value: object, _base: Path) -> tuple[str, ...]:
    """``{ host = "8G", gpu0 = "20G" }``: each memory's budget, as the ``--memory-budget`` items."""
    expected = 'a table of memory budgets, e.g. { host = "8G", gpu0 = "20G" }'
    if not isinstance(value, dict):
        raise _Bad(expected)
    items = []
    for name, size in value.items():
        if isinstance(size, bool) or not isinstance(size, (str, int)):
            raise _Bad(f"{expected}; {name} = {_describe(size)}")
        items.append(f"{name}={size}")
    try:
        parse_budget(items)
    except ValueError as exc:
        raise _Bad(f"{expected}; {exc}") from None
    return tuple(items)


def _gpus(value: object, _base: Path) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _Bad("an array of GPU indices")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise _Bad(f"an array of GPU indices (integers >= 0); {_describe(item)} is not one")
    if len(set(value)) != len(value):
        raise _Bad("an array of distinct GPU indices")
    return tuple(value)


def _resources(value: object, _base: Path) -> dict[str, int]:
    if not isinstance(value, dict):
        raise _Bad("a table of resource name = count")
    out: dict[str, int] = {}
    for name, count in value.items():
        if not name.strip():
            raise _Bad("a table of resource name = count; a name is empty")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise _Bad(f"a table of resource name = count (an integer >= 0); {name} = {_describe(count)}")
        out[name] = count
    return out


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list in the kernel's notation (``"0-3,8,10-11"``); raises ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        m = _CPU_RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"not a CPU list: {text!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first or last >= MAX_CPU:
            raise ValueError(f"not a CPU list: {text!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpus(cpus: frozenset[int]) -> str:
    """The inverse of :func:`parse_cpus`, with ranges: ``{0, 1, 2, 3, 8}`` -> ``"0-3,8"``."""
    parts: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _affinity(value: object, _base: Path) -> dict[str, tuple[frozenset[int], ...]]:
    expected = 'a table of model name (or "*") = an array of CPU lists such as "0-3,8", one per instance'
    if not isinstance(value, dict):
        raise _Bad(expected)
    out: dict[str, tuple[frozenset[int], ...]] = {}
    for model, lists in value.items():
        if not (model == "*" or _MODEL_NAME.fullmatch(model)):
            raise _Bad(f"{expected}; {model!r} is not a model name")
        if not isinstance(lists, list) or not lists:
            raise _Bad(f"{expected}; {model} = {_describe(lists)}")
        sets = []
        for item in lists:
            try:
                if not isinstance(item, str):
                    raise ValueError
                sets.append(parse_cpus(item))
            except ValueError:
                raise _Bad(f"{expected}; {model} has {_describe(item)}") from None
        out[model] = tuple(sets)
    return out


def _cpu_list(value: object, _base: Path) -> frozenset[int]:
    expected = 'a CPU list such as "1" or "2-3,6"'
    if not isinstance(value, str):
        raise _Bad(expected)
    try:
        return parse_cpus(value)
    except ValueError:
        raise _Bad(expected) from None


def cpus_for(
    affinity: Mapping[str, tuple[frozenset[int], ...]], model: str, instance: int
) -> frozenset[int] | None:
    """The CPUs instance ``instance`` of ``model`` is pinned to: the model's lists (else ``"*"``'s) taken in
    turn; None when neither is configured (no pinning)."""
    lists = affinity.get(model) or affinity.get("*")
    return lists[instance % len(lists)] if lists else None


# ---------------------------------------------------------------------------------------- the keys


@dataclass(frozen=True)
class Key:
    """One configuration key: its converter, the ``zinfer serve`` flag that overrides it (None: file
    only), and the argparse destination its value goes under."""

    convert: Callable[[object, Path], Any]
    flag: str | None
    dest: str


KEYS: dict[str, Key] = {
    "model_repository": Key(_path, "--model-repository", "model_repository"),
    "runtime_dir": Key(_path, "--runtime-dir", "runtime_dir"),
    "tcp": Key(_address, "--tcp", "tcp"),
    "metrics": Key(_metrics, "--metrics", "metrics"),
    "socket_group": Key(_text, "--socket-group", "socket_group"),
    "curve_secret_key": Key(_path, "--curve-secret-key", "curve_secret_key"),
    "curve_allow": Key(_path, "--curve-allow", "curve_allow"),
    "max_tensor_bytes": Key(_integer(1), "--max-tensor-bytes", "max_tensor_bytes"),
    "max_batch_bytes": Key(_integer(0), "--max-batch-bytes", "max_batch_bytes"),
    "max_region_bytes": Key(_integer(0), "--max-region-bytes", "max_region_bytes"),
    "max_user_region_bytes": Key(_integer(0), "--max-user-region-bytes", "max_user_region_bytes"),
    "max_unread_reply_bytes": Key(_integer(0), "--max-unread-reply-bytes", "max_unread_reply_bytes"),
    "drain_timeout_s": Key(_seconds(False), "--drain-timeout", "drain_timeout"),
    "exit_timeout_s": Key(_seconds(False), "--exit-timeout", "exit_timeout"),
    "heartbeat_interval_s": Key(_seconds(True), None, "heartbeat_interval_s"),
    "heartbeat_liveness": Key(_integer(1), None, "heartbeat_liveness"),
    "log_level": Key(_choice(LOG_LEVELS, str.upper), "--log-level", "log_level"),
    "model_control_mode": Key(_choice(MODEL_CONTROL_MODES, str.lower), "--model-control-mode",
                              "model_control_mode"),
    # --load-model appends, so the file's list goes under its own name and the flags replace it whole
    "load_models": Key(_model_names, "--load-model", "config_load_models"),
    # on-demand model control; flags replace the file's table whole
    "memory_budget": Key(_budget, "--memory-budget", "config_memory_budget"),
    "model_idle_unload_s": Key(_seconds(True), "--model-idle-unload", "config_model_idle_unload"),
    "cache_bytes": Key(_integer(0), None, "cache_bytes"),
    "rate_limit_resources": Key(_resources, None, "rate_limit_resources"),
    "gpus": Key(_gpus, None, "gpus"),
    "cpu_affinity": Key(_affinity, None, "cpu_affinity"),
    # the KServe v2 front door (frontdoor/): Triton's gRPC and HTTP APIs in processes of their own
    "grpc": Key(_address, "--grpc", "grpc"),
    "http": Key(_address, "--http", "http"),
    "frontdoor_workers": Key(_integer(1), "--frontdoor-workers", "frontdoor_workers"),
    "frontdoor_cpus": Key(_cpu_list, "--frontdoor-cpus", "frontdoor_cpus"),
    "tls_cert": Key(_path, "--tls-cert", "tls_cert"),
    "tls_key": Key(_path, "--tls-key", "tls_key"),
    "tls_client_ca": Key(_path, "--tls-client-ca", "tls_client_ca"),
    "insecure_remote": Key(_flag, "--insecure-remote", "insecure_remote"),
    "allow_unknown_shm_callers": Key(_flag, "--allow-unknown-shm-callers", "allow_unknown_shm_callers"),
    "http_header_timeout_s": Key(_seconds(True), "--http-header-timeout", "http_header_timeout"),
    "http_peer_connections": Key(_integer(1), "--http-peer-connections", "http_peer_connections"),
}  # fmt: skip
"""Every key the file may hold."""

FILE_ONLY_KEYS = tuple(name for name, key in KEYS.items() if key.flag is None)
"""Keys no flag overrides; they become ``ServerOptions`` fields of the same name."""


def parse_config(data: Mapping[str, object], base: Path, source: str = "<config>") -> dict[str, Any]:
    """Validate a decoded TOML document: ``{key: value}`` for the keys it sets, converted (paths resolved
    against ``base``)."""
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = KEYS.get(name)
        if key is None:
            close = difflib.get_close_matches(name, list(KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigFileError(source, name, f"unknown key{hint}")
        try:
            values[name] = key.convert(value, base)
        except _Bad as exc:
            raise ConfigFileError(source, name, f"expected {exc}, got {_describe(value)}") from None
    return values


def load_config(path: Path) -> dict[str, Any]:
    """Read and validate a configuration file; raises :class:`ConfigFileError`."""
    source = str(path)
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise ConfigFileError(source, None, "reading TOML needs Python 3.11 or newer, or the tomli package")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigFileError(source, None, f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(source, None, f"not valid TOML: {exc}") from None
    return parse_config(data, path.resolve().parent, source)


def flag_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """The file's values keyed by argparse destination, to become ``zinfer serve``'s defaults."""
    return {KEYS[name].dest: value for name, value in values.items()}
