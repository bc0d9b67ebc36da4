"""The worker's heartbeat: a thread with its own DEALER (identity ``<worker>.hb``) that says HEARTBEAT to
the broker every interval and expects the broker's HEARTBEAT back.

The broker declares a worker dead when its heartbeats stop for ``liveness`` intervals (a frozen or wedged
process) and kills it; the worker exits by itself when the broker's answers stop for as long (the broker
is gone). Heartbeats travel on their own socket so that a long batch in the main thread does not look
like a hang, while a process that stops entirely does.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from zinfer.client import protocol
from zinfer.client.protocol import Command
from zinfer.client.transport import send_frames

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes,
                 interval_s: float, liveness: int) -> None:  # fmt: skip
        self.interval_s = interval_s
        self.liveness = liveness
        self._stop = threading.Event()
        self._sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, identity + protocol.HEARTBEAT_SUFFIX)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_HEADER_BYTES)  # heartbeats only: small
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name="zinfer-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s * 2 + 1)
        self._sock.close(linger=0)

    def _run(self) -> None:
        ping = protocol.encode(Command.W_HEARTBEAT, {})
        last_answer = time.monotonic()
        while not self._stop.is_set():
            send_frames(self._sock, ping)
            deadline = time.monotonic() + self.interval_s
            while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                if self._sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    self._sock.recv_multipart()
                    last_answer = time.monotonic()
            if time.monotonic() - last_answer > self.interval_s * self.liveness:
                log.error("event=broker_silent seconds=%.1f action=exit", time.monotonic() - last_answer)
                os._exit(3)  # the broker is gone or wedged: a new one will start a new worker
