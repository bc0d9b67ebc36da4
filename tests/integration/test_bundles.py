"""Coalesced messages (BUNDLE) over a real server: several requests of one connection in one message, each
keeping its own id, status, errors and cancellation; the replies of one turn bundled back.

Raw DEALER sockets build the bundles by hand (mixed models, mixed errors, malformed bundles); the
``AsyncClient`` bundles what its tasks issue in one turn of the event loop (cancel racing that send); a
client process that dies right after its bundle leaves the server serving everyone else.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, start_server, wait_for
from zinfer.client import AsyncClient, Client, protocol
from zinfer.client.errors import Status
from zinfer.client.protocol import Command, InferRequest, TensorRef

pytestmark = pytest.mark.integration

ONE = np.ones((1, 1), np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``add``, ``identity`` and ``delayed`` (``add`` whose batcher waits 3 s for a batch of 8)."""
    repo = tmp_path_factory.mktemp("bundles")
    for name in ("add", "identity"):
        shutil.copytree(MODELS / name, repo / name)
    shutil.copytree(MODELS / "add", repo / "delayed")
    cfg = (repo / "delayed" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "delayed"').replace("max_batch_size: 16", "max_batch_size: 8")
    cfg = cfg.replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 3000000")
    (repo / "delayed" / "config.pbtxt").write_text(cfg + TRITON_TIMING)
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def sock(server: ServerProcess) -> Iterator[zmq.Socket[bytes]]:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.url)
    yield s
    s.close(linger=0)


def _infer(rid: str, model: str, names: tuple[str, ...], datatype: str = "FP32") -> dict[str, Any]:
    inputs = tuple(TensorRef(n, datatype, (1, 1), frame=i) for i, n in enumerate(names))
    return protocol.infer_to_wire(InferRequest(rid, model, 0, inputs))


def _bad_frame(rid: str) -> dict[str, Any]:
    """An ``add`` INFER whose second input names an inline frame the message does not have."""
    header = _infer(rid, "add", ("INPUT_A", "INPUT_B"))
    header["inputs"][1]["frame"] = 5
    return header


def _f32(x: float) -> bytes:
    return np.full(1, x, np.float32).tobytes()


def _collect(sock: zmq.Socket[bytes], ids: set[str]) -> tuple[dict[str, tuple[Any, list[Any]]], int]:
    """Replies by id until every one of ``ids`` has come (each receive bounded); and how many of the
    messages that carried them were bundles."""
    got: dict[str, tuple[Any, list[Any]]] = {}
    bundles = 0
    while not ids <= got.keys():
        assert sock.poll(20_000), f"no reply for {sorted(ids - got.keys())}"
        frames = sock.recv_multipart()
        bundles += protocol.is_bundle(frames)
        for msg in protocol.decode_many(frames, frozenset({Command.REPLY})):
            reply = protocol.reply_from_wire(msg.header)
            got[reply.request_id] = (reply, msg.frames)
    return got, bundles


def _value(reply: Any, frames: list[Any], name: str) -> float:
    (out,) = [o for o in reply.body["outputs"] if o["name"] == name]
    return float(np.frombuffer(frames[out["frame"]], np.float32)[0])


def test_mixed_models_and_errors_in_one_message(sock: zmq.Socket[bytes]) -> None:
    """Each entry is answered as if it had come alone: its own id, status and outputs; the errors of one
    do nothing to the others. The answers made in the same turn come back bundled."""
    entries: list[tuple[Command, dict[str, Any], list[bytes]]] = [
        (Command.INFER, _infer("ok-add", "add", ("INPUT_A", "INPUT_B")), [_f32(1), _f32(2)]),
        (Command.INFER, _infer("no-model", "no_such_model", ("X",)), [_f32(0)]),
        (Command.SERVER_LIVE, {"id": "live"}, []),
        (Command.INFER, _infer("ok-identity", "identity", ("INPUT0",)), [_f32(7)]),
        (Command.INFER, _infer("missing-input", "add", ("INPUT_A",)), [_f32(1)]),
        (Command.INFER, _infer("bad-type", "add", ("INPUT_A", "INPUT_B"), "INT32"), [_f32(1), _f32(1)]),
        (Command.INFER, _bad_frame("bad-frame"), [_f32(1), _f32(2)]),
        (Command.INFER, _infer("ok-add-2", "add", ("INPUT_A", "INPUT_B")), [_f32(10), _f32(20)]),
    ]  # fmt: skip
    sock.send_multipart(protocol.encode_bundle(entries))
    got, bundles = _collect(sock, {h["id"] for _, h, _ in entries})
    assert got["ok-add"][0].status == Status.OK and _value(*got["ok-add"], "OUTPUT_SUM") == 3.0
    assert got["ok-add-2"][0].status == Status.OK and _value(*got["ok-add-2"], "OUTPUT_SUM") == 30.0
    assert got["ok-identity"][0].status == Status.OK and _value(*got["ok-identity"], "OUTPUT0") == 7.0
    assert got["live"][0].status == Status.OK and got["live"][0].body is True
    assert got["no-model"][0].status == Status.NOT_FOUND
    for rid in ("missing-input", "bad-type", "bad-frame"):
        assert got[rid][0].status == Status.INVALID_ARGUMENT, (rid, got[rid][0])
    assert bundles >= 1, "the errors answered in the same turn were not bundled"


def test_a_bundle_of_infers_is_answered_entry_by_entry(sock: zmq.Socket[bytes]) -> None:
    """A bundle of INFERs only, as the clients and the front door send them, which the broker reads
    straight from its bytes (``protocol.decode_infer_bundle``): each entry answered as if it had come
    alone, a request the model refuses among ones it runs, as the general path answers them."""
    entries: list[tuple[Command, dict[str, Any], list[bytes]]] = [
        (Command.INFER, _infer("ok-1", "add", ("INPUT_A", "INPUT_B")), [_f32(1), _f32(2)]),
        (Command.INFER, _infer("no-model", "no_such_model", ("X",)), [_f32(0)]),
        (Command.INFER, _infer("missing-input", "add", ("INPUT_A",)), [_f32(1)]),
        (Command.INFER, _infer("bad-type", "add", ("INPUT_A", "INPUT_B"), "INT32"), [_f32(1), _f32(1)]),
        (Command.INFER, _bad_frame("bad-frame"), [_f32(1), _f32(2)]),
        (Command.INFER, _infer("ok-2", "identity", ("INPUT0",)), [_f32(7)]),
        *[(Command.INFER, _infer(f"ok-n{i}", "add", ("INPUT_A", "INPUT_B")), [_f32(i), _f32(i)])
          for i in range(20)],
    ]  # fmt: skip
    frames = protocol.encode_bundle(entries)
    assert protocol.decode_infer_bundle(frames) is not None  # the typed path is the one under test
    sock.send_multipart(frames)
    got, _ = _collect(sock, {h["id"] for _, h, _ in entries})
    assert got["ok-1"][0].status == Status.OK and _value(*got["ok-1"], "OUTPUT_SUM") == 3.0
    assert got["ok-2"][0].status == Status.OK and _value(*got["ok-2"], "OUTPUT0") == 7.0
    for i in range(20):
        assert _value(*got[f"ok-n{i}"], "OUTPUT_SUM") == 2.0 * i
    assert got["no-model"][0].status == Status.NOT_FOUND
    for rid in ("missing-input", "bad-type", "bad-frame"):
        assert got[rid][0].status == Status.INVALID_ARGUMENT, (rid, got[rid][0])
    assert "frame 5" in got["bad-frame"][0].error


@pytest.mark.parametrize(
    "index, frames",
    [
        ([[int(Command.INFER), _infer("x", "add", ("INPUT_A", "INPUT_B")), 3]], [b"a", b"b"]),
        ([[int(Command.SERVER_LIVE), {"id": "x"}, 2]], []),  # names frames the message lacks
        ([[int(Command.SERVER_LIVE), {"id": "x"}, 0]], [b"stray"]),  # a frame no entry names
        ([[int(Command.BUNDLE), {"id": "x"}, 0]], []),  # nested
        ([[int(Command.REPLY), {"id": "x"}, 0]], []),  # not a client command
        ([[True, {"id": "x"}, 0]], []),
        ([[int(Command.SERVER_LIVE), ["id", "x"], 0]], []),
        ([], []),
        ({"id": "x"}, []),
        ([[int(Command.SERVER_LIVE), {"id": "x"}, 0]] * (protocol.MAX_BUNDLE + 1), []),
    ],
)
def test_a_malformed_bundle_is_refused_whole(
    sock: zmq.Socket[bytes], index: Any, frames: list[bytes]
) -> None:
    sock.send_multipart([protocol.PROTOCOL + bytes([Command.BUNDLE]) + msgpack.packb(index), *frames])
    sock.send_multipart(protocol.encode(Command.SERVER_LIVE, {"id": "after"}))
    got, _ = _collect(sock, {"", "after"})
    assert got[""][0].status == Status.INVALID_ARGUMENT and "ProtocolError" in got[""][0].error
    assert "x" not in got, "an entry of a malformed bundle was handled"
    assert got["after"][0].body is True


def test_cancel_racing_a_coalesced_send(server: ServerProcess) -> None:
    """A task cancelled while its request still waits in the client's queue for this turn's send: the
    request goes out, the cancel after it; the server drops it from its queue (it never runs), the late
    reply frees its shared-memory slots, and the request sent with it is answered."""

    async def main() -> None:
        async with AsyncClient(server.url, timeout=30, inline_threshold=-1) as c:
            await c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}, client_timeout=10)  # metadata cached
            before = (await c.statistics("delayed"))["model_stats"][0]["execution_count"]
            doomed = asyncio.create_task(c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}))
            other = asyncio.create_task(c.infer("add", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}))
            await asyncio.sleep(0)  # both tasks ran up to their wait: their requests are queued, not sent
            assert c._conn._out, "the requests were sent before the turn ended"
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            assert (await other).as_numpy("OUTPUT_SUM")[0, 0] == 3.0
            await asyncio.to_thread(
                wait_for, lambda: not c._orphans and c._conn.in_flight == 0, 20, "the late reply"
            )
            stats = (await c.statistics("delayed"))["model_stats"][0]
            assert stats["execution_count"] == before, "the cancelled request ran"

    asyncio.run(main())


_DYING_CLIENT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import zmq
    from zinfer.client import protocol
    from zinfer.client.protocol import Command, InferRequest, TensorRef

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(sys.argv[1])
    one = np.ones(1, np.float32).tobytes()
    refs = (TensorRef("INPUT_A", "FP32", (1, 1), frame=0), TensorRef("INPUT_B", "FP32", (1, 1), frame=1))
    entries = []
    for i in range(100):
        model = "delayed" if i % 2 else "add"
        header = protocol.infer_to_wire(InferRequest(f"d{i}", model, 0, refs))
        entries.append((Command.INFER, header, [one, one]))
    sock.send_multipart(protocol.encode_bundle(entries))
    sock.send_multipart(protocol.encode(Command.SERVER_LIVE, {"id": "sync"}))
    assert sock.poll(20000)  # answers have started: the bundle is in the server's hands
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_client_dying_mid_message_leaves_the_server_serving(server: ServerProcess, tmp_path: Path) -> None:
    """A client sends a bundle of 100 requests and is killed while they are answered; the replies it will
    never read are dropped, and the server keeps answering everyone else, the held batch included."""
    with Client(server.url, timeout=30) as c:
        before = c.statistics("delayed")["model_stats"][0]["inference_count"]
        proc = subprocess.run([sys.executable, "-c", _DYING_CLIENT, server.url], timeout=60, check=False)
        assert proc.returncode == -9, proc
        wait_for(
            lambda: c.statistics("delayed")["model_stats"][0]["inference_count"] >= before + 50,
            30,
            "the dead client's queued requests to run",
        )
        out = c.infer("add", {"INPUT_A": ONE, "INPUT_B": 2 * ONE}).as_numpy("OUTPUT_SUM")
        assert out[0, 0] == 3.0
        assert c.is_server_live()
    assert "Traceback" not in server.log()
