"""The points ``zinfer tune`` sweeps: ``Point`` (one setting of each swept field), ``apply_point`` (the
config.pbtxt text with a point's settings, everything else kept as written, comments included) and
``default_ranges`` (what is swept when the command line gives no range). No sockets, no files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.instances import InstanceKind
from zinfer.modelconfig.model_config import ModelConfig

__all__ = ["DEFAULTS_HELP", "Point", "apply_point", "default_ranges"]

# ---------------------------------------------------------------------------------------------- config text

_SCAN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*')
  | (?P<open>[{\[<])
  | (?P<close>[}\]>])
  | (?P<sep>[,;])
  | (?P<colon>:)
  | (?P<word>[^\s#"'{}\[\]<>,;:]+)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Span:
    name: str
    start: int  # where the field name starts
    end: int  # just past the value (and a ',' or ';' after it)
    value_start: int  # where the value starts ('{' or '[' of a block)


def _tokens(text: str) -> list[tuple[str, str, int, int]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _SCAN.match(text, pos)
        if m is None:  # pragma: no cover - the pattern matches any character
            raise ConfigError(f"cannot scan the config near offset {pos}")
        kind = m.lastgroup or ""
        if kind not in ("space", "comment"):
            out.append((kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return out


def _fields(text: str, lo: int, hi: int) -> list[_Span]:
    """The fields written directly in ``text[lo:hi]`` (the inside of one message), with their spans."""
    toks = _tokens(text[lo:hi])
    spans: list[_Span] = []
    i = 0
    while i < len(toks):
        kind, word, start, _ = toks[i]
        if kind != "word":
            i += 1
            continue
        i += 1
        if i < len(toks) and toks[i][0] == "colon":
            i += 1
        if i >= len(toks):
            break
        value_start = toks[i][2]
        if toks[i][0] == "open":
            depth = 0
            while i < len(toks):
                if toks[i][0] == "open":
                    depth += 1
                elif toks[i][0] == "close":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
        elif toks[i][0] == "string":
            while i + 1 < len(toks) and toks[i + 1][0] == "string":
                i += 1
        end = toks[min(i, len(toks) - 1)][3]
        i += 1
        if i < len(toks) and toks[i][0] == "sep":
            end = toks[i][3]
            i += 1
        spans.append(_Span(word, lo + start, lo + end, lo + value_start))
    return spans


def _messages(text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ``{...}`` blocks directly inside a ``[ ... ]`` list value (or the one block itself), as the
    offsets of their insides."""
    toks = _tokens(text[lo:hi])
    out: list[tuple[int, int]] = []
    depth, opened = 0, 0
    list_value = bool(toks) and toks[0][1] == "["
    base = 1 if list_value else 0
    for kind, _, start, end in toks:
        if kind == "open":
            depth += 1
            if depth == base + 1:
                opened = end
        elif kind == "close":
            if depth == base + 1:
                out.append((lo + opened, lo + start))
            depth -= 1
    return out


def _set(text: str, lo: int, hi: int, name: str, new: str | None, nested: bool = False) -> str:
    """``text`` with field ``name`` of the message inside ``text[lo:hi]`` replaced by ``new`` (every
    occurrence, the first keeps its place), removed (``new`` None), or added at the end if absent."""
    spans = [s for s in _fields(text, lo, hi) if s.name == name]
    if not spans:
        if new is None:
            return text
        body_end = max(lo, len(text[:hi].rstrip()))
        tail = text[body_end:hi]
        if not nested or "\n" in text[lo:hi]:  # one field a line
            prefix = "\n" if body_end > 0 else ""
            indent = "  " if nested else ""
            return text[:body_end] + prefix + indent + new + (tail if "\n" in tail else "\n") + text[hi:]
        return text[:body_end] + " " + new + " " + text[hi:]
    for span in reversed(spans[1:]):
        text = text[: span.start] + text[span.end :]
    first = spans[0]
    if new is None:
        end = first.end
        if text[end : end + 1] == "\n" and (first.start == 0 or text[first.start - 1] == "\n"):
            end += 1
        return text[: first.start] + text[end:]
    return text[: first.start] + new + text[first.end :]


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep; None leaves the original setting."""

    max_batch_size: int | None = None
    preferred_batch_size: tuple[int, ...] | None = None
    max_queue_delay_us: int | None = None
    instance_count: int | None = None

    @property
    def label(self) -> str:
        parts = []
        if self.max_batch_size is not None:
            parts.append(f"mbs={self.max_batch_size}")
        if self.preferred_batch_size is not None:
            parts.append(f"pref=[{','.join(map(str, self.preferred_batch_size))}]")
        if self.max_queue_delay_us is not None:
            parts.append(f"delay={self.max_queue_delay_us}us")
        if self.instance_count is not None:
            parts.append(f"inst={self.instance_count}")
        return " ".join(parts) or "original"


def apply_point(text: str, point: Point) -> str:
    """The config text with the point's settings; everything else (comments included) stays as written."""
    if point.max_batch_size is not None:
        text = _set(text, 0, len(text), "max_batch_size", f"max_batch_size: {point.max_batch_size}")
    if point.preferred_batch_size is not None or point.max_queue_delay_us is not None:
        dyn = [s for s in _fields(text, 0, len(text)) if s.name == "dynamic_batching"]
        if not dyn:
            text = _set(text, 0, len(text), "dynamic_batching", "dynamic_batching {\n}")
            dyn = [s for s in _fields(text, 0, len(text)) if s.name == "dynamic_batching"]
        changes: list[tuple[str, str | None]] = []
        if point.preferred_batch_size is not None:
            sizes = ", ".join(map(str, point.preferred_batch_size))
            changes.append(("preferred_batch_size", f"preferred_batch_size: [ {sizes} ]" if sizes else None))
        if point.max_queue_delay_us is not None:
            changes.append(
                ("max_queue_delay_microseconds", f"max_queue_delay_microseconds: {point.max_queue_delay_us}")
            )
        for name, new in changes:
            dyn = [s for s in _fields(text, 0, len(text)) if s.name == "dynamic_batching"]
            (lo, hi), *_ = _messages(text, dyn[0].value_start, dyn[0].end)
            text = _set(text, lo, hi, name, new, nested=True)
    if point.instance_count is not None:
        groups = [s for s in _fields(text, 0, len(text)) if s.name == "instance_group"]
        if not groups:
            line = f"instance_group [ {{ count: {point.instance_count} }} ]"
            return _set(text, 0, len(text), "instance_group", line)
        # every group of every instance_group field gets the count; from the end, so offsets stay valid
        blocks = [b for g in groups for b in _messages(text, g.value_start, g.end)]
        for lo, hi in sorted(blocks, reverse=True):
            text = _set(text, lo, hi, "count", f"count: {point.instance_count}", nested=True)
    return text


DEFAULTS_HELP = """\
default ranges (for each range not given; the sweep is every combination, bounded by --max-points and
--time-limit, and a table row is printed for each point tried):
  --max-batch-size      the config's max_batch_size, half and a quarter of it (not swept when it is 0)
  --preferred-batch-size  none (Triton's default: max_batch_size), plus the config's own list if it has one
  --max-queue-delay-us  0, 5% and 20% of the latency budget, plus the config's own delay
  --instance-count      KIND_GPU models: 1 and 2 per GPU; others: 1, 2, 4, ... up to half the CPU cores
                        (at least 1); plus the config's own count
"""


def default_ranges(config: ModelConfig, budget_us: float, cpus: int) -> dict[str, list[Any]]:
    """The ranges ``zinfer tune`` sweeps when none is given (see ``DEFAULTS_HELP``)."""
    m = config.max_batch_size
    dyn = config.dynamic_batching
    out: dict[str, list[Any]] = {}
    if m > 0:
        out["max_batch_size"] = sorted({max(1, m // 4), max(1, m // 2), m})
        own = dyn.preferred_batch_size if dyn is not None else ()
        out["preferred_batch_size"] = list(dict.fromkeys([(), *([own] if own and own != (m,) else [])]))
        delays = {0, round(budget_us * 0.05), round(budget_us * 0.2)}
        out["max_queue_delay_us"] = sorted(delays | ({dyn.max_queue_delay_microseconds} if dyn else set()))
    counts = {g.count for g in config.instance_group} or {1}
    if any(g.kind is InstanceKind.KIND_GPU for g in config.instance_group):
        choices = {1, 2}
    else:
        choices = {1 << i for i in range(8) if 1 << i <= max(1, cpus // 2)}
    out["instance_count"] = sorted(choices | counts)
    return out
