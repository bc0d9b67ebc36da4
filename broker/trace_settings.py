"""Trace settings: Triton's ``--trace-config`` syntax, its trace extension's setting names, and checks.

``--trace-config <setting>=<value>`` sets a global setting (``rate``, ``level``, ``count``, ``mode``);
``--trace-config <mode>,<setting>=<value>`` one of a mode's (``triton``: ``file``, ``log-frequency``;
``opentelemetry``: ``url``, ``resource``, ``bsp_*``). The trace extension (``v2/trace/setting``) names the
same settings ``trace_level``, ``trace_rate``, ``trace_count``, ``trace_file``, ``log_frequency`` and
``trace_mode``, each value a string or a list of strings (``trace_level``). Bad input is a ``ValueError``
whose text says which setting and why; nothing is changed by a rejected update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .trace_otel import check as check_otel

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
OTEL_KEYS = ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
SETTING_NAMES = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")
"""The names of the trace extension's settings, in the order they are reported."""


@dataclass(frozen=True)
class TraceSettings:
    level: tuple[str, ...] = ("OFF",)  # OFF, or any of TIMESTAMPS / TENSORS
    rate: int = 1000  # every rate-th request is traced
    count: int = -1  # traces still to collect; -1: no limit
    mode: str = "triton"
    file: str = ""  # triton mode: where the JSON goes ("" keeps traces in memory only)
    log_frequency: int = 0  # triton mode: write every N traces to file.<i>; 0: to file at shutdown
    otel: tuple[tuple[str, str], ...] = ()  # opentelemetry mode's own settings, as given

    @property
    def enabled(self) -> bool:
        """Whether requests are traced under these settings at all."""
        return "OFF" not in self.level and self.count != 0

    def to_wire(self) -> dict[str, str | list[str]]:
        """The trace extension's view (Triton's names, strings)."""
        return {
            "trace_file": self.file,
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_mode": self.mode,
        }


def _int(name: str, text: str, low: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"trace setting {name}: expected an integer, got {text!r}") from None
    if value < low:
        raise ValueError(f"trace setting {name}: must be at least {low}, got {value}")
    return value


def _levels(values: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        level = v.strip().upper()
        if level not in LEVELS:
            raise ValueError(f"trace setting level: expected one of {', '.join(LEVELS)}, got {v!r}")
        if level not in out:
            out.append(level)
    if not out:
        raise ValueError("trace setting level: no level given")
    if "OFF" in out and len(out) > 1:
        raise ValueError("trace setting level: OFF cannot be combined with another level")
    return tuple(out)


def parse_trace_config(args: Iterable[str]) -> TraceSettings:
    """Settings from ``--trace-config`` values (each ``[mode,]setting=value``), over the defaults.

    ``level`` given several times adds levels, as in Triton; ``level=OFF`` turns tracing off."""
    s = TraceSettings()
    levels: list[str] = []
    otel: list[tuple[str, str]] = []
    for arg in args:
        scope, sep, rest = arg.partition(",")
        if not sep:
            scope, rest = "", arg
        name, eq, value = rest.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"--trace-config expects [MODE,]SETTING=VALUE, got {arg!r}")
        if scope == "":
            if name == "rate":
                s = dataclasses.replace(s, rate=_int("rate", value, 1))
            elif name == "count":
                s = dataclasses.replace(s, count=_int("count", value, -1))
            elif name == "level":
                levels.extend(_levels([value]))
            elif name == "mode":
                if value not in MODES:
                    raise ValueError(f"trace setting mode: expected triton or opentelemetry, got {value!r}")
                s = dataclasses.replace(s, mode=value)
            else:
                raise ValueError(
                    f"--trace-config: unknown global setting {name!r} (rate, level, count, mode)"
                )
        elif scope == "triton":
            if name == "file":
                s = dataclasses.replace(s, file=value)
            elif name == "log-frequency":
                s = dataclasses.replace(s, log_frequency=_int("log-frequency", value, 0))
            else:
                raise ValueError(f"--trace-config triton: unknown setting {name!r} (file, log-frequency)")
        elif scope == "opentelemetry":
            if name not in OTEL_KEYS:
                raise ValueError(
                    f"--trace-config opentelemetry: unknown setting {name!r} ({', '.join(OTEL_KEYS)})"
                )
            otel.append((name, value))
        else:
            raise ValueError(f"--trace-config: unknown mode {scope!r} (triton, opentelemetry)")
    if levels:
        s = dataclasses.replace(s, level=_levels(levels))
    if otel:
        check_otel(otel)
        s = dataclasses.replace(s, otel=tuple(otel))
    return s


def update(base: TraceSettings, changes: Mapping[str, object]) -> TraceSettings:
    """``base`` with the trace extension's ``changes`` applied (names in ``SETTING_NAMES``; each value a
    string, or a list of strings for ``trace_level``); a ``ValueError`` for any bad name or value."""
    s = base
    for name, value in changes.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) for v in values):
            raise ValueError(f"trace setting {name}: expected a string or a list of strings")
        texts: list[str] = [str(v) for v in values]
        if name != "trace_level" and len(texts) != 1:
            raise ValueError(f"trace setting {name}: expected one value, got {len(texts)}")
        if name == "trace_level":
            s = dataclasses.replace(s, level=_levels(texts))
        elif name == "trace_rate":
            s = dataclasses.replace(s, rate=_int(name, texts[0], 1))
        elif name == "trace_count":
            s = dataclasses.replace(s, count=_int(name, texts[0], -1))
        elif name == "log_frequency":
            s = dataclasses.replace(s, log_frequency=_int(name, texts[0], 0))
        elif name == "trace_file":  # where the broker writes is the operator's choice, not a client's
            if texts[0] != s.file:
                raise ValueError("trace setting trace_file: can only be set with --trace-config triton,file=")
        elif name == "trace_mode":
            if texts[0] != s.mode:
                raise ValueError("trace setting trace_mode: cannot be changed while serving")
        else:
            raise ValueError(f"unknown trace setting {name!r} ({', '.join(SETTING_NAMES)})")
    return s
