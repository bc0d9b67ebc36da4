"""``zinfer status``: the server's models and worker processes as a fixed-width terminal table.

The broker answers the client's ``server_status()`` call with a dict of this shape (every figure may be
``None`` when unknown; missing keys render as ``-``)::

    {
      "server": {"pid": int, "uptime_s": float, "ready": bool},
      "models": [
        {
          "name": str, "version": int,
          "state": "READY" | "LOADING" | "UNAVAILABLE" | …,
          "reason": str | None,          # why it is not ready
          "queue_depth": int,            # requests queued, not yet sent to an instance
          "mean_batch_1m": float | None, # mean rows per batch over the last minute
          "p99_ms_1m": float | None,     # p99 end-to-end latency over the last minute
          "rate_1m": float,              # requests per second over the last minute
          "instances": [
            {"instance": int, "pid": int | None, "device": str, "state": str,
             "rss_bytes": int | None, "cpu_s": float | None, "restarts": int,
             "busy_s": float | None}     # seconds in its current batch; None when idle
          ],
        }
      ],
      "memory": {                        # only with --model-control-mode on-demand
        "mode": "on-demand", "budget": {memory: int}, "resident": {memory: int},   # memory: host, gpuN
        "loads": int, "evictions": int, "loading": [str], "waiting_requests": int,
        "idle_unload_s": float | None,
      },
    }

The ``*_1m`` figures are the server's own, over the requests completed in the last minute. This module reads
only that answer (the wire data), nothing of the server's internals.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TextIO

from zinfer.client import Client
from zinfer.client.errors import ZinferError

__all__ = ["main", "render"]

_Row = Sequence[str]


class StatusSource(Protocol):
    def server_status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _fmt_num(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, spec)


def _fmt_bytes(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return "-"  # pragma: no cover


def _fmt_duration(seconds: Any) -> str:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return "-"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    text = f"{hours}h{minutes:02d}m{s:02d}s" if hours or days else f"{minutes}m{s:02d}s"
    return f"{days}d{text}" if days else text


def _text(value: Any, width: int = 0) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text if not width or len(text) <= width else text[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[_Row], right: Sequence[bool]) -> list[str]:
    """Columns as wide as their widest cell; numbers right-aligned; the last column not padded."""
    widths = [max(len(r[c]) for r in (headers, *rows)) for c in range(len(headers))]
    lines = []
    for row in (headers, *rows):
        cells = [
            cell.rjust(w) if rj else cell.ljust(w) for cell, w, rj in zip(row, widths, right, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


_MODEL_HEADERS = ("MODEL", "VER", "STATE", "QUEUE", "BATCH/1m", "P99 ms/1m", "REQ/s 1m", "REASON")
_MODEL_RIGHT = (False, True, False, True, True, True, True, False)
_INSTANCE_HEADERS = ("INSTANCE", "PID", "DEVICE", "STATE", "RSS", "CPU s", "RESTARTS", "BUSY s")
_INSTANCE_RIGHT = (False, True, False, False, True, True, True, True)
_FRONTDOOR_HEADERS = ("FRONT DOOR", "PID", "STATE", "RESTARTS", "gRPC ok/failed", "HTTP ok/failed")
_FRONTDOOR_RIGHT = (False, True, False, True, True, True)


def _frontdoor_rows(doors: Any) -> list[_Row]:
    rows: list[_Row] = []
    for d in doors or []:
        counts = d.get("requests") or {}
        pair = {p: f"{(counts.get(p) or {}).get('ok', 0)}/{(counts.get(p) or {}).get('failed', 0)}"
                for p in ("grpc", "http")}  # fmt: skip
        state = "UP" if d.get("up") else ("GAVE UP" if d.get("given_up") else "DOWN")
        rows.append((_text(d.get("index")), _text(d.get("pid")), state, _fmt_num(d.get("restarts"), "d"),
                     pair["grpc"], pair["http"]))  # fmt: skip
    return rows


def _memory_line(memory: Any) -> str:
    """On-demand model control: each memory's resident bytes against its budget, loads and evictions."""
    if not isinstance(memory, Mapping):
        return ""
    budget = memory.get("budget") or {}
    resident = memory.get("resident") or {}
    parts = []
    for name in sorted(set(budget) | set(resident)):
        limit = _fmt_bytes(budget[name]) if name in budget else "no budget"
        parts.append(f"{name} {_fmt_bytes(resident.get(name, 0))} / {limit}")
    line = f"on-demand  {'  '.join(parts) or 'no budget'}  loads {_fmt_num(memory.get('loads'), 'd')}  "
    line += f"evictions {_fmt_num(memory.get('evictions'), 'd')}"
    if memory.get("loading"):
        line += f"  loading {','.join(str(n) for n in memory['loading'])}"
    if memory.get("waiting_requests"):
        line += f"  waiting {_fmt_num(memory.get('waiting_requests'), 'd')}"
    return line


def render(status: Mapping[str, Any], reason_width: int = 60) -> str:
    """The status dict (shape in the module docstring) as text lines, ending with a newline."""
    server = status.get("server") or {}
    ready = server.get("ready")
    head = (
        f"zinfer  pid {_text(server.get('pid'))}  up {_fmt_duration(server.get('uptime_s'))}  "
        f"{'ready' if ready else 'not ready' if ready is not None else 'ready: -'}"
    )
    memory = _memory_line(status.get("memory"))
    models = sorted(status.get("models") or [], key=lambda m: (str(m.get("name")), m.get("version") or 0))
    model_rows: list[_Row] = []
    instance_rows: list[_Row] = []
    for m in models:
        model_rows.append(
            (
                _text(m.get("name")),
                _text(m.get("version")),
                _text(m.get("state")),
                _fmt_num(m.get("queue_depth"), "d"),
                _fmt_num(m.get("mean_batch_1m"), ".2f"),
                _fmt_num(m.get("p99_ms_1m"), ".2f"),
                _fmt_num(m.get("rate_1m"), ".1f"),
                _text(m.get("reason"), reason_width) if m.get("reason") else "",
            )
        )
        for inst in sorted(m.get("instances") or [], key=lambda i: i.get("instance") or 0):
            instance_rows.append(
                (
                    f"{_text(m.get('name'))}/{_text(m.get('version'))}/{_text(inst.get('instance'))}",
                    _text(inst.get("pid")),
                    _text(inst.get("device")),
                    _text(inst.get("state")),
                    _fmt_bytes(inst.get("rss_bytes")),
                    _fmt_num(inst.get("cpu_s"), ".1f"),
                    _fmt_num(inst.get("restarts"), "d"),
                    _fmt_num(inst.get("busy_s"), ".1f"),
                )
            )
    lines = [head, *([memory] if memory else []), ""]
    lines += _table(_MODEL_HEADERS, model_rows, _MODEL_RIGHT) if model_rows else ["no models"]
    if instance_rows:
        lines += ["", *_table(_INSTANCE_HEADERS, instance_rows, _INSTANCE_RIGHT)]
    door_rows = _frontdoor_rows(status.get("frontdoors"))
    if door_rows:
        lines += ["", *_table(_FRONTDOOR_HEADERS, door_rows, _FRONTDOOR_RIGHT)]
    return "\n".join(lines) + "\n"


def _connect(url: str | None, timeout: float) -> StatusSource:
    return Client(url, timeout=timeout)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zinfer status", description="Show a zinfer server's models and workers."
    )
    p.add_argument("--url", default=None, help="the server's URL (default: the default runtime directory)")
    p.add_argument("--watch", type=float, default=None, metavar="SECONDS", help="redraw every SECONDS")
    p.add_argument("--count", type=int, default=None, metavar="N", help="with --watch: stop after N draws")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the server")
    return p


def main(
    argv: Sequence[str] | None = None,
    *,
    connect: Callable[[str | None, float], StatusSource] = _connect,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """``zinfer status [--url URL] [--watch SECONDS] [--count N]``; 0 on success, 1 if the server fails."""
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    if args.watch is not None and args.watch <= 0:
        print("zinfer status: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    redraw = args.watch is not None and stream.isatty()
    drawn = 0
    try:
        source = connect(args.url, args.timeout)
    except ZinferError as exc:
        print(f"zinfer status: {exc}", file=sys.stderr)
        return 1
    try:
        while True:
            try:
                text = render(source.server_status())
            except ZinferError as exc:
                print(f"zinfer status: {exc}", file=sys.stderr)
                return 1
            stream.write(("\x1b[H\x1b[2J" if redraw else "") + text)
            stream.flush()
            drawn += 1
            if args.watch is None or (args.count is not None and drawn >= args.count):
                return 0
            if not redraw:
                stream.write("\n")
            sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # the reader left (``zinfer status --watch 1 | head``): stop quietly
        if stream is sys.stdout:
            # what is still buffered cannot be written either: send it, and the flush at exit, nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        source.close()
