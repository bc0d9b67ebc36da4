"""Where the broker's parts send: a reply to a client, a message to a worker.

The server owns the sockets; every collaborator that answers a client or tells a worker something (request
admission and completion, model control) is handed this outbox instead of the server itself. Client
identities carry a one-byte tag of the socket they came in on (``IPC_TAG``, ``TCP_TAG``), so a reply goes
back the same way. Nothing here blocks: a peer that is gone or not reading is logged and skipped.

The outbox remembers which sockets it sent on (``take_sent``), so the server's wait asks ``EVENTS`` only of
the sockets a turn used (a send may take a message's wake-up from the socket's descriptor).

Between ``hold`` and ``flush`` (one turn of the server loop) the replies to a connection that speaks bundles
(it has sent one, ``bundles_to``) are kept, and ``flush`` sends them as one BUNDLE message (one when there
is only one), in the order they were made: one send instead of one per request.

The bytes of large replies a connection has not read yet are counted (``reply_backlog``): a reply that would
take a connection past ``--max-unread-reply-bytes`` goes as a ``ResourceExhausted`` error instead, and the
server refuses the connection's new requests while it is at the limit (``backlog_full``).
"""

from __future__ import annotations

import logging
from typing import Any

import zmq
from mypy_extensions import mypyc_attr

from zinfer.client import protocol
from zinfer.client.errors import ResourceExhausted, Status
from zinfer.client.protocol import Command, Frame, Reply
from zinfer.client.transport import NOBLOCK, SNDMORE, send_frames
from zinfer.client.worker_protocol import Execute, encode_execute

from .reply_backlog import DEFAULT_MAX_UNREAD_REPLY_BYTES, ReplyBacklog

log = logging.getLogger(__name__)

IPC_TAG, TCP_TAG = b"i", b"t"  # prefixes of client identities by the socket they came in on
_MAX_BUNDLING = 1 << 14  # connections remembered as speaking bundles (forgotten all at once past this)

_Held = tuple[Command, dict[str, Any], list[Frame]]


@mypyc_attr(allow_interpreted_subclasses=True)  # tests record what it sends by subclassing it
class Outbox:
    def __init__(self, max_unread_reply_bytes: int = DEFAULT_MAX_UNREAD_REPLY_BYTES) -> None:
        self.backlog = ReplyBacklog(max_unread_reply_bytes)
        self._held_bytes: dict[bytes, int] = {}  # bytes of the replies ``hold`` keeps, per connection
        self._frontend: zmq.Socket[bytes] | None = None
        self._tcp: zmq.Socket[bytes] | None = None
        self._backend: zmq.Socket[bytes] | None = None
        self._bundling: set[bytes] = set()  # connections that speak bundles
        self._held: dict[bytes, list[_Held]] | None = None  # replies kept until ``flush``
        self._sent_on: list[zmq.Socket[bytes]] = []  # sockets sent on since ``take_sent`` (repeats allowed)

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
        sock = self._tcp if identity[:1] == TCP_TAG and self._tcp is not None else self._frontend
        self._sent_on.append(sock)
        return sock

    def take_sent(self) -> list[zmq.Socket[bytes]]:
        """The sockets sent on (or tried) since the last call, each at least once; forgets them."""
        sent, self._sent_on = self._sent_on, []
        return sent

    def send_client(self, identity: bytes, reply: Reply, frames: list[Frame] | None = None) -> None:
        """A reply to the client connection ``identity`` (tagged with its socket)."""
        if frames and self.backlog.limit:
            nbytes = sum(len(f) for f in frames)
            if self.backlog.tracks(nbytes):
                kept = self._held_bytes.get(identity, 0)  # this turn's, not sent yet
                already = self.backlog.held(identity) + kept
                if already and already + nbytes > self.backlog.limit:
                    reply, frames = self._unread_refusal(reply, already, nbytes), None
                elif self._held is not None and identity in self._bundling:
                    self._held_bytes[identity] = kept + nbytes
        header = protocol.reply_to_wire(reply)
        if self._held is not None and identity in self._bundling:
            self._held.setdefault(identity, []).append((Command.REPLY, header, frames or []))
            return
        self._send_client(identity, protocol.encode(Command.REPLY, header, frames or ()), reply.request_id)

    def _unread_refusal(self, reply: Reply, held: int, nbytes: int) -> Reply:
        """The error that replaces a reply of ``nbytes`` to a connection that holds ``held`` unread."""
        log.warning("event=reply_dropped reason=unread_replies request=%s held=%d bytes=%d",
                    reply.request_id, held, nbytes)  # fmt: skip
        text = f"ResourceExhausted: {self.unread_text(held)}; its {nbytes} bytes of outputs were dropped"
        return Reply(reply.request_id, Status.RESOURCE_EXHAUSTED, text)

    def unread_text(self, held: int) -> str:
        return (
            f"the connection holds {held} bytes of replies it has not read, at the "
            f"{self.backlog.limit} byte limit of one connection (--max-unread-reply-bytes)"
        )

    def check_reading(self, identity: bytes) -> None:
        """Raise ``ResourceExhausted`` when the connection is at its limit of unread replies."""
        why = self.backlog_full(identity)
        if why is not None:
            raise ResourceExhausted(why)

    def backlog_full(self, identity: bytes) -> str | None:
        """Why the connection's new requests are refused (it is not reading its replies), or None."""
        if not self.backlog.full(identity):
            return None
        held = self.backlog.held(identity)
        return f"{self.unread_text(held)}: read the replies before sending more requests"

    def _send_client(self, identity: bytes, msg: list[Frame], what: str) -> None:
        sock = self._client_socket(identity)
        try:
            if self.backlog.limit:
                nbytes = sum(len(f) for f in msg)
                if self.backlog.tracks(nbytes):
                    # the last frame, zero-copy and tracked, is released once the whole message has left
                    send_frames(sock, [identity[1:], *msg[:-1]], SNDMORE | NOBLOCK)
                    last = zmq.Frame(msg[-1], track=True, copy=False)
                    sock.send(last, NOBLOCK, copy=False)
                    assert last.tracker is not None
                    self.backlog.add(identity, last.tracker, nbytes)
                    return
            send_frames(sock, [identity[1:], *msg], NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone or not reading: count it, never block the loop
            log.warning("event=reply_undeliverable request=%s error=%r", what, exc.strerror)

    def bundles_to(self, identity: bytes) -> None:
        """``identity`` sent a BUNDLE: its replies may be bundled from now on."""
        if identity not in self._bundling:
            if len(self._bundling) >= _MAX_BUNDLING:
                self._bundling.clear()  # they come back with their next bundle
            self._bundling.add(identity)

    def hold(self) -> None:
        """Keep replies to connections that speak bundles until ``flush``."""
        if self._held is None:
            self._held = {}

    def flush(self) -> None:
        """Send what ``hold`` kept: per connection, one message (a BUNDLE when several)."""
        held, self._held = self._held, None
        self._held_bytes.clear()
        if not held:
            return
        for identity, items in held.items():
            for chunk in _chunks(items):
                if len(chunk) == 1:
                    cmd, header, frames = chunk[0]
                    self._send_client(identity, protocol.encode(cmd, header, frames), str(header.get("id")))
                else:
                    self._send_client(identity, protocol.encode_bundle(chunk), f"bundle of {len(chunk)}")

    def send_held(self) -> None:
        """Send what ``hold`` kept so far and go on holding (the turn's later replies wait for ``flush``);
        nothing to do, and nothing made, when nothing is held."""
        if self._held:
            self.flush()
            self.hold()

    def send_worker(
        self,
        identity: bytes,
        command: Command,
        header: dict[str, Any] | Execute,
        frames: list[Frame] | None = None,
    ) -> bool:
        """A message to the worker ``identity``; False when it could not be reached. An EXECUTE goes as its
        record, encoded as it is (``worker_protocol.encode_execute``)."""
        assert self._backend is not None
        self._sent_on.append(self._backend)
        if isinstance(header, Execute):
            msg = encode_execute(header, frames or ())
        else:
            msg = protocol.encode(command, header, frames or ())
        try:
            send_frames(self._backend, [identity, *msg], NOBLOCK)
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


def _chunks(items: list[_Held]) -> list[list[_Held]]:
    """``items`` in runs that fit one BUNDLE (MAX_BUNDLE entries, MAX_BUNDLE_FRAMES inline frames)."""
    out: list[list[_Held]] = []
    run: list[_Held] = []
    frames = 0
    for item in items:
        n = len(item[2])
        if run and (len(run) >= protocol.MAX_BUNDLE or frames + n > protocol.MAX_BUNDLE_FRAMES):
            out.append(run)
            run, frames = [], 0
        run.append(item)
        frames += n
    if run:
        out.append(run)
    return out
