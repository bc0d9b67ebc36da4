"""A relay between a client and a local server that records what crosses the wire, as the broker reads it.

``WireSpy(server.url)`` binds a socket beside the server's (``spy.url``) and relays every message both ways:
a client given ``spy.url`` talks to the server through it, shared memory included (the region hand-off
socket is found beside the client's socket, so it is the server's own). It spies on the wire, not on the
client's code: it sees what a compiled client sends as well as an interpreted one (a spy on a method of a
compiled class is never called by the class's own compiled code).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.protocol import Command, InferRequest, TensorRef

__all__ = ["WireSpy"]


class WireSpy:
    """Relays one client's messages to the server at ``server_url`` (``ipc://``) and keeps the INFERs it
    sent and the outputs the server's replies named. Use as a context manager, around the client."""

    def __init__(self, server_url: str) -> None:
        assert server_url.startswith("ipc://"), "a local server: the spy sits beside its socket"
        self.server_url = server_url
        self.url = f"ipc://{Path(server_url[6:]).parent / 'spy.sock'}"
        self.sent: list[InferRequest] = []
        self.replied: list[list[TensorRef]] = []  # each INFER reply's outputs, as the wire named them
        self.cancelled: list[str] = []  # the ids the client's CANCELs named
        self._infers: set[str] = set()  # wire ids of the INFERs sent, whose replies are read
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._relay, name="wire-spy", daemon=True)

    def __enter__(self) -> WireSpy:
        self._thread.start()
        assert self._ready.wait(10), "the spy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._error is not None and exc[0] is None:
            raise AssertionError(f"the spy failed: {self._error!r}")

    def input(self, name: str) -> TensorRef:
        """The last INFER's input ``name``, as the server read it."""
        return next(t for t in self.sent[-1].inputs if t.name == name)

    def output(self, name: str) -> TensorRef:
        """Output ``name`` of the last INFER reply, as the server named it."""
        return next(t for t in self.replied[-1] if t.name == name)

    def _relay(self) -> None:
        ctx = zmq.Context()
        front = ctx.socket(zmq.ROUTER)
        back = ctx.socket(zmq.DEALER)
        try:
            for s in (front, back):
                s.setsockopt(zmq.LINGER, 0)
            front.bind(self.url)
            back.connect(self.server_url)
            poller = zmq.Poller()
            poller.register(front, zmq.POLLIN)
            poller.register(back, zmq.POLLIN)
            peer: bytes | None = None
            self._ready.set()
            while not self._stop.is_set():
                for sock, _ in poller.poll(20):
                    if sock is front:
                        peer, *frames = front.recv_multipart()
                        self._record(frames, Command.INFER)
                        back.send_multipart(frames)
                    elif peer is not None:
                        frames = back.recv_multipart()
                        self._record(frames, Command.REPLY)
                        front.send_multipart([peer, *frames])
        except BaseException as exc:  # seen by ``__exit__``
            self._error = exc
        finally:
            self._ready.set()
            front.close(0)
            back.close(0)
            ctx.term()

    def _record(self, frames: list[Any], command: Command) -> None:
        for m in protocol.decode_many(frames):
            if command == Command.INFER and m.command == Command.CANCEL:
                self.cancelled.append(protocol.cancel_command_from_wire(m.header).target)
                continue
            if m.command != command:
                continue
            if command == Command.INFER:
                req = protocol.infer_from_wire(m.header)
                self._infers.add(req.request_id)
                self.sent.append(req)
                continue
            reply = protocol.reply_from_wire(m.header)
            if reply.request_id in self._infers and reply.status == 0:
                self.replied.append([protocol.tensor_from_wire(t) for t in reply.body["outputs"]])
