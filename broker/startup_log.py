"""What the log says while a server starts: a progress line every ``PROGRESS_S`` while the models of the start
load, then one ``event=ready`` line with what a user needs to reach it (the client socket, TCP, the front
doors, the metrics address), which models serve and which failed (each once), and which build runs.

The ready line (and systemd's READY=1, which follows it) waits for the parts named in ``waits`` (the front
doors: their ports bound) for up to ``WAIT_LIMIT_S``; one still not up then is named in the line
(``not_up=``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .compiled import COMPILED, compiled_here
from .model_state import ModelState

__all__ = ["PROGRESS_S", "WAIT_LIMIT_S", "StartupLog", "build_name"]

log = logging.getLogger("zinfer.broker.server")

PROGRESS_S = 5.0
WAIT_LIMIT_S = 60.0


def build_name() -> str:
    """``compiled`` (every module of ``COMPILED`` is), ``pure``, or ``partly-compiled:n/m``."""
    done, total = len(compiled_here()), len(COMPILED)
    return "compiled" if done == total else "pure" if done == 0 else f"partly-compiled:{done}/{total}"


class StartupLog:
    def __init__(self, now: float) -> None:
        self.started = now
        self._next_progress = now + PROGRESS_S
        # the key=value fields of the ready line that say where the server is (socket, tcp, doors, metrics)
        self.where: dict[str, str] = {}
        # what else must be up before the ready line, by name: a cheap check, called each loop turn until true
        self.waits: dict[str, Callable[[], bool]] = {}
        self._models_done: float | None = None

    def restart(self, now: float) -> None:
        """The models start loading now."""
        self.started = now
        self._next_progress = now + PROGRESS_S

    def progress(self, now: float, loading: Iterable[ModelState], models_ready: int) -> None:
        """Every ``PROGRESS_S`` while ``loading`` (the states of the pending loads) is not empty."""
        states = list(loading)
        if now < self._next_progress or not states:
            return
        self._next_progress = now + PROGRESS_S
        names = sorted({s.name for s in states})
        up = sum(min(len(s.instances), s.expected_instances) for s in states)
        waiting = ",".join(names[:8]) + (",..." if len(names) > 8 else "")
        log.info(
            "event=loading elapsed_s=%.0f models_ready=%d models_loading=%d instances_up=%d/%d waiting=%s",
            now - self.started, models_ready, len(names), up, sum(s.expected_instances for s in states),
            waiting,
        )  # fmt: skip

    def ready(self, now: float, ready: Iterable[str], failed: Iterable[str]) -> bool:
        """The one ready line: ``ready`` as ``name:version``, ``failed`` model names (each listed once). False
        (nothing logged; call again) while a part of ``waits`` is not up and ``WAIT_LIMIT_S`` has not passed
        since the models were done."""
        if self._models_done is None:
            self._models_done = now
        not_up = [name for name, up in self.waits.items() if not up()]
        if not_up and now - self._models_done < WAIT_LIMIT_S:
            return False
        fields = {**self.where, "build": build_name(), "startup_s": f"{now - self.started:.1f}"}
        if not_up:
            fields["not_up"] = ",".join(not_up)
        where = " ".join(f"{k}={v}" for k, v in fields.items())
        models, failures = ",".join(sorted(ready)) or "-", ",".join(sorted(set(failed))) or "-"
        log.info("event=ready models=%s failed=%s %s", models, failures, where)
        return True
