"""systemd's readiness and watchdog protocol (sd_notify(3)) in a few lines, with no dependency.

A service started with ``Type=notify`` finds the manager's datagram socket in ``$NOTIFY_SOCKET``: a file
path, or ``@name`` for Linux's abstract namespace. It sends newline-separated ``KEY=VALUE`` assignments
there: ``READY=1`` once it serves, ``STATUS=…`` for ``systemctl status``, ``WATCHDOG=1`` at least once per
``$WATCHDOG_USEC`` microseconds when the unit sets ``WatchdogSec=``, and ``STOPPING=1`` when it begins to
shut down. Without ``$NOTIFY_SOCKET`` every call does nothing, so the same code runs under systemd, in a
terminal and in tests.

Sends never block the caller: the socket is non-blocking, and a message the manager cannot take right now
is dropped. A dropped ``READY=1`` or ``STOPPING=1`` is sent again on the next tick; a dropped ping is
simply followed by the next one, half a watchdog period later.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""What systemd puts in a notify service's environment; worker processes must not inherit it."""

MAX_STATUS_CHARS = 400


def notify_address(value: str | None) -> str | None:
    """The ``AF_UNIX`` address for a ``$NOTIFY_SOCKET`` value; None when unset or of a kind not supported
    here (``vsock:`` addresses)."""
    if not value:
        return None
    if value[0] == "@":
        return "\0" + value[1:]
    if value[0] == "/":
        return value
    return None


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises.

    None when the watchdog is off, when ``$WATCHDOG_PID`` names another process (the variables were
    inherited, and the watchdog belongs to the parent), or when the values are not positive integers.
    """
    env = os.environ if env is None else env
    usec_text = env.get("WATCHDOG_USEC")
    if not usec_text:
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        log.warning("event=bad_watchdog_env WATCHDOG_USEC=%r", usec_text)
        return None
    if usec <= 0:
        log.warning("event=bad_watchdog_env WATCHDOG_USEC=%r", usec_text)
        return None
    pid_text = env.get("WATCHDOG_PID")
    if pid_text:
        try:
            watched = int(pid_text)
        except ValueError:
            log.warning("event=bad_watchdog_env WATCHDOG_PID=%r", pid_text)
            return None
        if watched != (os.getpid() if pid is None else pid):
            return None
    return usec / 2_000_000


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_STATUS_CHARS]


class Notifier:
    """Tells the service manager how the server is doing. The broker calls :meth:`loop_tick` from its main
    loop (so a stuck loop stops the pings and systemd restarts the service) and :meth:`stopping` when asked
    to stop. ``interval`` is the watchdog ping period in seconds (None: no watchdog)."""

    def __init__(self, address: str | None, interval: float | None = None) -> None:
        self.address = address
        self.interval = interval if address is not None else None
        self._sock: socket.socket | None = None
        self._ready_sent = False
        self._stopping_sent = False
        self._stopping_status = ""
        self._status = ""
        self._next_ping = float("-inf")
        self._warned = False

    @classmethod
    def from_environment(cls, env: MutableMapping[str, str] | None = None, *, unset: bool = True) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET`` and the watchdog variables. With ``unset`` (the default) they
        are removed from ``env`` so that worker processes started later do not inherit them."""
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET")
        address = notify_address(raw)
        if raw and address is None:
            log.warning("event=notify_socket_unsupported NOTIFY_SOCKET=%r", raw)
        interval = watchdog_interval(env)
        if unset:
            for key in ENV_KEYS:
                env.pop(key, None)
        return cls(address, interval)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def ready_sent(self) -> bool:
        return self._ready_sent

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; True when the manager took it (always False when
        disabled). Never blocks and never raises."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except BlockingIOError:
            return False  # the manager's queue is full: try again on a later tick
        except OSError as exc:
            if not self._warned:  # once: a missing manager must not flood the log
                self._warned = True
                log.warning("event=notify_failed address=%r error=%r", self.address, exc.strerror or str(exc))
            return False
        return True

    def loop_tick(self, now: float, ready: bool, status: str) -> None:
        """Called from the main loop on each pass (``now`` from ``time.monotonic()``): ``READY=1`` the first
        time ``ready`` holds (never after :meth:`stopping`), ``STATUS=`` when ``status`` changes, and
        ``WATCHDOG=1`` once per ping period."""
        if self.address is None:
            return
        if self._stopping_status and not self._stopping_sent:
            self._send_stopping()
        status = _one_line(status)
        if ready and not self._ready_sent and not self._stopping_status:
            if self.send("READY=1", f"STATUS={status}"):
                self._ready_sent = True
                self._status = status
        elif status and status != self._status and self.send(f"STATUS={status}"):
            self._status = status
        if self.interval is not None and now >= self._next_ping and self.send("WATCHDOG=1"):
            self._next_ping = now + self.interval

    def stopping(self, status: str = "stopping") -> None:
        """``STOPPING=1`` (once): the service is shutting down. Later ticks keep pinging the watchdog."""
        if self.address is None or self._stopping_status:
            return
        self._stopping_status = _one_line(status) or "stopping"
        self._send_stopping()

    def _send_stopping(self) -> None:
        if self.send("STOPPING=1", f"STATUS={self._stopping_status}"):
            self._stopping_sent = True
            self._status = self._stopping_status

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
