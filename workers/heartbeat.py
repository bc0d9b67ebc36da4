"""The worker's heartbeat: a thread with its own DEALER (identity ``<worker>.hb``) that says HEARTBEAT to
the broker every interval and expects the broker's HEARTBEAT back.

The broker declares a worker dead when its heartbeats stop for ``liveness`` intervals (a frozen or wedged
process) and kills it; the worker exits by itself when the broker's answers stop for as long (the broker
is gone). Heartbeats travel on their own socket so that a long batch in the main thread does not look
like a hang, while a process that stops entirely does.

Each heartbeat also carries the custom metrics the model defined (``zinfer.workers.custom_metrics``), when it
defined any, so that the broker can export them (a snapshot over half the header limit is left out, logged
once), and a GPU worker's device memory (``device_bytes``, for on-demand model control's budgets).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.metric_snapshot import families_to_wire
from zinfer.client.protocol import Command, Frame
from zinfer.client.transport import send_frames

from .metric_registry import MetricRegistry

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes,
                 interval_s: float, liveness: int,
                 metrics: MetricRegistry | None = None) -> None:  # fmt: skip
        self.metrics = metrics if metrics is not None else MetricRegistry()  # the model's custom metrics
        self.interval_s = interval_s
        self.liveness = liveness
        self._stop = threading.Event()
        self._sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, identity + protocol.HEARTBEAT_SUFFIX)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_HEADER_BYTES)  # heartbeats only: small
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name="zinfer-heartbeat", daemon=True)
        # ``stop`` wakes the thread through this pipe: a worker told to stop exits at once, not at the next
        # interval (an unload, on-demand control's eviction, waits for the process to be gone)
        self._wake_r, self._wake_w = os.pipe()
        self._too_big_logged = False
        # the device memory the worker holds (a GPU worker sets it once its device is open); None: none
        self.device_bytes: Callable[[], int] | None = None

    def start(self) -> None:
        self._thread.start()

    def report_now(self) -> None:
        """Send a heartbeat now, not at the next interval: the model just loaded, and the broker's budget
        wants its device memory before the next load is planned."""
        os.write(self._wake_w, b"r")

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(self.interval_s * 2 + 1)
        self._sock.close(linger=0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def ping(self) -> list[Frame]:
        """One heartbeat: empty, or with the model's custom metrics and the device memory it holds."""
        header: dict[str, Any] = {}
        if self.device_bytes is not None:
            try:
                header["device_bytes"] = int(self.device_bytes())
            except Exception:  # noqa: BLE001 - a figure that cannot be read is left out, never fatal
                pass
        families = self.metrics.snapshot()
        if families:
            frames = protocol.encode(
                Command.W_HEARTBEAT, {**header, "metrics": families_to_wire(families)}
            )
            if len(frames[0]) <= protocol.MAX_HEADER_BYTES // 2:
                return frames
            if not self._too_big_logged:
                log.warning("event=custom_metrics_too_big bytes=%d action=not_sent", len(frames[0]))
                self._too_big_logged = True
        return protocol.encode(Command.W_HEARTBEAT, header)

    def _run(self) -> None:
        last_answer = time.monotonic()
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            send_frames(self._sock, self.ping())
            deadline = time.monotonic() + self.interval_s
            while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                events = dict(poller.poll(int(left * 1000) + 1))
                if self._sock in events:
                    self._sock.recv_multipart()
                    last_answer = time.monotonic()
                if self._wake_r in events:
                    os.read(self._wake_r, 64)
                    break  # ``report_now`` (or ``stop``): the next heartbeat goes now
            if time.monotonic() - last_answer > self.interval_s * self.liveness:
                log.error("event=broker_silent seconds=%.1f action=exit", time.monotonic() - last_answer)
                os._exit(3)  # the broker is gone or wedged: a new one will start a new worker
