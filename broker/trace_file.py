"""Triton-mode trace output: a JSON array of trace entries, written whole, never half.

With ``log_frequency`` N > 0 every N traces go to ``<file>.<i>`` (i = 0, 1, ...); the rest, and with N = 0
all of them, are written when the server stops (to ``<file>.<i>``, or to ``<file>`` when nothing was written
before), as Triton does. Each write goes to a temporary file beside the target and is renamed over it, so
a reader never sees part of an array. An empty ``path`` keeps nothing (settings can still be changed live).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


class TraceFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.index = 0  # the next <file>.<i>
        self._entries: list[dict[str, Any]] = []
        self._traces = 0  # traces in _entries
        self.written = 0  # traces written so far, all files together

    def add(self, entries: list[dict[str, Any]], log_frequency: int) -> None:
        """One trace's entries; written out when ``log_frequency`` traces have gathered."""
        if not self.path:
            return
        self._entries.extend(entries)
        self._traces += 1
        if log_frequency > 0 and self._traces >= log_frequency:
            self._write(f"{self.path}.{self.index}")
            self.index += 1

    def extra(self, entries: list[dict[str, Any]]) -> None:
        """More entries of a trace already added (the door's timestamps): they go with the next write."""
        if self.path:
            self._entries.extend(entries)

    def close(self) -> None:
        """Write what is left (the server is stopping)."""
        if self.path and self._entries:
            self._write(self.path if self.index == 0 else f"{self.path}.{self.index}")

    def _write(self, target: str) -> None:
        tmp = f"{target}.tmp{os.getpid()}"
        try:
            text = json.dumps(self._entries, separators=(",", ":"))  # the C encoder: json.dump is not
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        except OSError as exc:
            log.error("event=trace_write_failed file=%s error=%r", target, str(exc))
            try:
                os.unlink(tmp)
            except OSError:
                pass
        else:
            self.written += self._traces
        self._entries = []
        self._traces = 0
