"""A bare client connection for tests that send hand-made messages (and hostile ones)."""

from __future__ import annotations

from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.protocol import Command
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.shm import Segment


class Raw:
    """A bare DEALER that sends hand-made messages and reads replies with a timeout."""

    def __init__(self, url: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def call(
        self, command: Command, header: dict[str, Any], frames: list[bytes] | None = None
    ) -> protocol.Reply:
        header.setdefault("id", "raw")
        self.send([bytes(f) for f in protocol.encode(command, header, frames or [])])
        return self.reply()

    def reply(self) -> protocol.Reply:
        while True:
            assert self.sock.poll(10_000), "no reply within 10 s"
            msg = protocol.decode(self.sock.recv_multipart())
            reply = protocol.reply_from_wire(msg.header)
            if reply.request_id != protocol.PROBE_ID:  # the server's liveness probe: not an answer
                return reply

    def register(self, seg: Segment, name: str | None = None) -> protocol.Reply:
        """Hand the segment's descriptor over, then claim it on this connection (as a client does)."""
        path = handoff_path(self.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        assert path is not None
        token = hand_over(path, seg.fd, 10.0)
        return self.call(Command.REGISTER, {"name": seg.name if name is None else name, "token": token})

    def close(self) -> None:
        self.sock.close(linger=0)
