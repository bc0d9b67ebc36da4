"""Where the broker's parts send: a reply to a client, a message to a worker.

The server owns the sockets; every collaborator that answers a client or tells a worker something (request
admission and completion, model control) is handed this outbox instead of the server itself. Client
identities carry a one-byte tag of the socket they came in on (``IPC_TAG``, ``TCP_TAG``), so a reply goes
back the same way. Nothing here blocks: a peer that is gone or not reading is logged and skipped.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from zinfer.client import protocol
from zinfer.client.errors import Status
from zinfer.client.protocol import Command, Frame, Reply
from zinfer.client.transport import NOBLOCK, send_frames

log = logging.getLogger(__name__)

IPC_TAG, TCP_TAG = b"i", b"t"  # prefixes of client identities by the socket they came in on


class Outbox:
    def __init__(self) -> None:
        self._frontend: zmq.Socket[bytes] | None = None
        self._tcp: zmq.Socket[bytes] | None = None
        self._backend: zmq.Socket[bytes] | None = None

    def attach(
        self,
        frontend: zmq.Socket[bytes],
        backend: zmq.Socket[bytes],
        tcp: zmq.Socket[bytes] | None = None,
    ) -> None:
        """The sockets to send on, once the server has bound them."""
        self._frontend, self._backend, self._tcp = frontend, backend, tcp

    def _client_socket(self, identity: bytes) -> zmq.Socket[bytes]:
        assert self._frontend is not None
        return self._tcp if identity[:1] == TCP_TAG and self._tcp is not None else self._frontend

    def send_client(self, identity: bytes, reply: Reply, frames: list[Frame] | None = None) -> None:
        """A reply to the client connection ``identity`` (tagged with its socket)."""
        msg = protocol.encode(Command.REPLY, protocol.reply_to_wire(reply), frames or ())
        try:
            send_frames(self._client_socket(identity), [identity[1:], *msg], NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone or not reading: count it, never block the loop
            log.warning("event=reply_undeliverable request=%s error=%r", reply.request_id, exc.strerror)

    def send_worker(
        self, identity: bytes, command: Command, header: dict[str, Any], frames: list[Frame] | None = None
    ) -> bool:
        """A message to the worker ``identity``; False when it could not be reached."""
        assert self._backend is not None
        try:
            send_frames(self._backend, [identity, *protocol.encode(command, header, frames or ())], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            log.warning("event=worker_unreachable worker=%s error=%r", identity, exc.strerror)
            return False

    def client_connected(self, identity: bytes) -> bool:
        """Whether the client connection ``identity`` is still there (a full queue counts as there): a
        reply no request asked for (``protocol.PROBE_ID``) is sent, and ``ROUTER_MANDATORY`` says at once
        whether that peer is still connected."""
        msg = protocol.encode(Command.REPLY, protocol.reply_to_wire(Reply(protocol.PROBE_ID, Status.OK)), ())
        try:
            send_frames(self._client_socket(identity), [identity[1:], *msg], NOBLOCK)
        except zmq.ZMQError as exc:
            return exc.errno != zmq.EHOSTUNREACH
        return True

    @staticmethod
    def is_local(identity: bytes) -> bool:
        """Whether a client identity came in on the local (ipc) socket."""
        return identity[:1] == IPC_TAG
