"""The outbox (``zinfer.broker.outbox``) on real ROUTER sockets: a reply reaches the client on the socket its
identity is tagged with, a message reaches a worker, and a peer that is gone is reported, never raised."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from zinfer.broker.outbox import IPC_TAG, TCP_TAG, Outbox
from zinfer.client import protocol
from zinfer.client.errors import Status
from zinfer.client.protocol import Command, Reply

TIMEOUT_MS = 5000
Wired = tuple[Outbox, dict[str, zmq.Socket[bytes]], zmq.Context[zmq.Socket[bytes]]]


def _router(ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[zmq.Socket[bytes], str]:
    sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.connect(endpoint)
    return sock


@pytest.fixture
def wired() -> Iterator[Wired]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    front, front_ep = _router(ctx)
    tcp, tcp_ep = _router(ctx)
    back, back_ep = _router(ctx)
    peers = {"ipc": _dealer(ctx, front_ep, b"c1"), "tcp": _dealer(ctx, tcp_ep, b"c2"),
             "worker": _dealer(ctx, back_ep, b"w1")}  # fmt: skip
    for name, peer in peers.items():  # the ROUTERs learn each identity from a first message
        peer.send(name.encode())
    for router in (front, tcp, back):
        assert router.poll(TIMEOUT_MS), "a peer's first message"
        router.recv_multipart()
    outbox = Outbox()
    outbox.attach(front, back, tcp)
    try:
        yield outbox, peers, ctx
    finally:
        for sock in (*peers.values(), front, tcp, back):
            sock.close(linger=0)
        ctx.term()


def _reply_of(sock: zmq.Socket[bytes]) -> Reply:
    msg = protocol.decode(sock.recv_multipart())
    assert msg.command == Command.REPLY
    return protocol.reply_from_wire(msg.header)


def test_replies_go_back_on_the_socket_the_identity_is_tagged_with(wired: Wired) -> None:
    outbox, peers, _ = wired
    outbox.send_client(IPC_TAG + b"c1", Reply("r1", Status.OK, body=1))
    outbox.send_client(TCP_TAG + b"c2", Reply("r2", Status.OK, body=2))
    assert _reply_of(peers["ipc"]).request_id == "r1"
    assert _reply_of(peers["tcp"]).request_id == "r2"
    assert Outbox.is_local(IPC_TAG + b"c1") and not Outbox.is_local(TCP_TAG + b"c2")


def test_a_worker_gets_its_message_and_an_unknown_one_is_reported(wired: Wired) -> None:
    outbox, peers, _ = wired
    assert outbox.send_worker(b"w1", Command.W_HEARTBEAT, {})
    assert protocol.decode(peers["worker"].recv_multipart()).command == Command.W_HEARTBEAT
    assert not outbox.send_worker(b"nobody", Command.W_HEARTBEAT, {})


def test_a_client_that_is_gone_is_reported_not_raised(wired: Wired) -> None:
    outbox, peers, _ = wired
    assert outbox.client_connected(IPC_TAG + b"c1")
    assert not outbox.client_connected(IPC_TAG + b"gone")
    outbox.send_client(IPC_TAG + b"gone", Reply("r3", Status.OK))  # logged, not raised
    assert _reply_of(peers["ipc"]).request_id == protocol.PROBE_ID  # the probe of the live connection


def test_a_connection_that_does_not_read_holds_at_most_the_unread_limit() -> None:
    """Issue 30 item 3, on real sockets: replies of 512 KiB to a peer that does not read (RCVHWM 1, small
    kernel buffers). Past the 2 MiB limit a reply goes as a ResourceExhausted error instead, and
    ``backlog_full`` says why new requests are refused; once the peer reads, what was held is released."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    front: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
    front.setsockopt(zmq.LINGER, 0)
    front.setsockopt(zmq.ROUTER_MANDATORY, 1)
    front.setsockopt(zmq.SNDBUF, 65536)
    port = front.bind_to_random_port("tcp://127.0.0.1")
    back, _ = _router(ctx)
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.IDENTITY, b"slow")
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.setsockopt(zmq.RCVBUF, 65536)
    peer.connect(f"tcp://127.0.0.1:{port}")
    limit, size = 2 << 20, 512 << 10
    outbox = Outbox(max_unread_reply_bytes=limit)
    outbox.attach(front, back)
    who = IPC_TAG + b"slow"
    try:
        peer.send(b"hello")
        assert front.poll(TIMEOUT_MS)
        front.recv_multipart()
        assert outbox.backlog_full(who) is None
        for i in range(64):  # 32 MiB of replies, none read
            outbox.send_client(who, Reply(f"r{i}", Status.OK, body=i), [bytes(size)])
            assert outbox.backlog.held(who) <= limit + size
        held = outbox.backlog.held(who)
        assert held > limit - size, f"only {held} bytes held: the test did not fill the connection"
        if held >= limit:  # (the kernel's buffers may have taken a little of it)
            assert "--max-unread-reply-bytes" in (outbox.backlog_full(who) or "")
        statuses = []
        peer.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        for _ in range(64):
            reply = _reply_of(peer)
            statuses.append(reply.status)
            if reply.status != Status.OK:
                assert "2097152 byte limit of one connection (--max-unread-reply-bytes)" in reply.error
        assert statuses[0] == Status.OK and Status.RESOURCE_EXHAUSTED in statuses
        deadline = time.monotonic() + 5
        while outbox.backlog.held(who) and time.monotonic() < deadline:  # read: the trackers fire
            time.sleep(0.01)
        assert outbox.backlog.held(who) == 0 and outbox.backlog_full(who) is None
        assert outbox.backlog.connections() == 0
    finally:
        for sock in (peer, front, back):
            sock.close(linger=0)
        ctx.term()


def test_the_outbox_reports_the_sockets_it_sent_on(wired: Wired) -> None:
    """The server's wait asks EVENTS only of the sockets a turn used: the outbox says which it sent on."""
    outbox, peers, _ = wired
    front, tcp, back = outbox._frontend, outbox._tcp, outbox._backend
    assert outbox.take_sent() == []
    outbox.send_client(TCP_TAG + b"c2", Reply("r", Status.OK))
    outbox.send_worker(b"w1", Command.W_HEARTBEAT, {})
    outbox.send_worker(b"gone", Command.W_HEARTBEAT, {})  # tried and failed: used all the same
    sent = outbox.take_sent()
    assert {id(s) for s in sent} == {id(tcp), id(back)} and all(s is not front for s in sent)
    assert outbox.take_sent() == []  # forgotten once taken
    outbox.bundles_to(IPC_TAG + b"c1")
    outbox.hold()
    outbox.send_client(IPC_TAG + b"c1", Reply("held", Status.OK))
    assert outbox.take_sent() == []  # kept for the bundle: not sent yet
    outbox.flush()
    assert [id(s) for s in outbox.take_sent()] == [id(front)]
    assert _reply_of(peers["ipc"]).request_id == "held"
