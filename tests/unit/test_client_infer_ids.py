"""The sync client's INFER on the wire, against a stub server: each goes out under a fresh wire id with the
caller's id beside it (the header is built with the wire id: nothing rebuilds it unless it is sent again,
as after ``UnknownRegion``), a caller's id can be cancelled while its request is out even when the request
holds no shared memory, and nothing of a finished request stays tracked."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.errors import Cancelled, Status
from zinfer.client.protocol import Command, InferRequest
from zinfer.client.trace_context import OTEL_MODULE

_META = {
    "name": "add", "versions": ["1"], "platform": "python", "max_batch_size": 8,
    "inputs": [{"name": "A", "datatype": "FP32", "shape": [-1, 1]}],
    "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, 1]}],
}  # fmt: skip


class StubServer:
    """A ROUTER on a thread: model metadata, and INFERs answered with their input doubled. ``script`` gives
    the status (and error) of each INFER's reply in turn (then OK); an INFER whose caller's id is
    ``"slow"`` is answered only when a CANCEL names it (then with CANCELLED)."""

    def __init__(self, url: str, script: list[tuple[Status, str]] | None = None) -> None:
        self.infers: list[InferRequest] = []
        self.cancels: list[str] = []
        self._script = list(script or [])
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(url)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        held: dict[str, tuple[bytes, InferRequest]] = {}
        while not self._stop:
            if not self._sock.poll(5):
                continue
            who, *frames = self._sock.recv_multipart()
            for m in protocol.decode_many(frames, protocol.CLIENT_COMMANDS):
                rid = str(m.header.get("id", ""))
                if m.command == Command.INFER:
                    req = protocol.infer_from_wire(m.header)
                    self.infers.append(req)
                    if req.caller_id == "slow":
                        held[req.request_id] = (who, req)
                        continue
                    status, error = self._script.pop(0) if self._script else (Status.OK, "")
                    self._answer(who, req, m.frames, status, error)
                elif m.command == Command.CANCEL:
                    target = protocol.cancel_command_from_wire(m.header).target
                    self.cancels.append(target)
                    self._reply(who, rid, Status.OK, "", True)
                    for wire_id in [w for w in held if w == target]:
                        back, req = held.pop(wire_id)
                        self._reply(back, wire_id, Status.CANCELLED, "Cancelled: by the caller", None)
                else:
                    body = _META if m.command == Command.MODEL_METADATA else True
                    self._reply(who, rid, Status.OK, "", body)

    def _answer(self, who: bytes, req: InferRequest, frames: list[Any], status: Status, error: str) -> None:
        if status != Status.OK:
            self._reply(who, req.request_id, status, error, None)
            return
        x = np.frombuffer(frames[req.inputs[0].frame or 0], np.float32) * 2
        body = {"model": "add", "version": 1, "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1, 1],
                                                             "frame": 0}]}  # fmt: skip
        header = protocol.reply_to_wire(protocol.Reply(req.request_id, Status.OK, body=body))
        self._sock.send_multipart([who, *protocol.encode(Command.REPLY, header, [x.tobytes()])])

    def _reply(self, who: bytes, rid: str, status: Status, error: str, body: Any) -> None:
        header = protocol.reply_to_wire(protocol.Reply(rid, status, error, body))
        self._sock.send_multipart([who, *protocol.encode(Command.REPLY, header, ())])

    def close(self) -> None:
        self._stop = True
        self._thread.join(10)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"ipc://{tmp_path / 's.sock'}"


@pytest.fixture
def server(url: str) -> Iterator[StubServer]:
    s = StubServer(url)
    try:
        yield s
    finally:
        s.close()


def _x(v: float) -> dict[str, Any]:
    return {"A": np.full((1, 1), v, np.float32)}


def test_each_infer_goes_out_under_a_fresh_wire_id_beside_the_callers(server: StubServer, url: str) -> None:
    with Client(url, timeout=10, shm=False) as c:
        assert c.infer("add", _x(1.0), request_id="mine").as_numpy("Y")[0, 0] == 2.0
        res = c.infer("add", _x(2.0))
        assert res.as_numpy("Y")[0, 0] == 4.0 and res.request_id == ""
        first, second = server.infers
        assert first.caller_id == "mine" and second.caller_id == ""
        assert first.request_id != second.request_id
        for req in (first, second):
            assert req.request_id.startswith(c._conn.new_id().rsplit("-", 1)[0])  # this connection's ids
        assert not c._orphans and not c._active  # nothing of a finished request stays tracked


def test_a_request_sent_again_after_unknown_region_has_a_new_wire_id(url: str) -> None:
    """The server forgot the client's regions (it restarted): the same request goes again, under a new id,
    its header otherwise the same."""
    server = StubServer(url, script=[(Status.INVALID_ARGUMENT, "UnknownRegion: no region 'r'")])
    try:
        with Client(url, timeout=10, shm=False) as c:
            assert c.infer("add", _x(3.0), request_id="again").as_numpy("Y")[0, 0] == 6.0
            first, second = server.infers
            assert first.request_id != second.request_id
            assert first._replace(request_id=second.request_id) == second
            assert not c._orphans and not c._active
    finally:
        server.close()


def test_a_callers_id_without_shared_memory_can_be_cancelled(server: StubServer, url: str) -> None:
    """A request that holds no slots is still found by its caller's id while it is out."""
    with Client(url, timeout=10, shm=False) as c:
        c.infer("add", _x(1.0))  # metadata fetched: the next call sends at once
        errors: list[BaseException] = []

        def call() -> None:
            try:
                c.infer("add", _x(1.0), request_id="slow")
            except BaseException as exc:  # seen by the test
                errors.append(exc)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while not c.cancel("slow"):
            assert time.monotonic() < deadline, "the request never showed as in flight"
            time.sleep(0.005)
        t.join(10)
        assert [type(e) for e in errors] == [Cancelled]
        assert server.cancels == [server.infers[-1].request_id]  # the wire id, not the caller's
        assert not c._orphans and not c._active
        assert not c.cancel("slow")


class _Span:
    """What ``trace_context.active_traceparent`` reads of an OpenTelemetry span."""

    def get_span_context(self) -> Any:
        return types.SimpleNamespace(is_valid=True, trace_id=0xAB, span_id=0xCD, trace_flags=1)


def test_the_traceparent_a_request_carries(
    server: StubServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None without ``trace_context`` or OpenTelemetry (the parameters untouched); the one given; one the
    parameters name already; the active OpenTelemetry span's once ``opentelemetry.trace`` is imported."""
    monkeypatch.delitem(sys.modules, OTEL_MODULE, raising=False)
    given = f"00-{'1' * 32}-{'2' * 16}-01"
    with Client(url, timeout=10, shm=False) as c:
        c.infer("add", _x(1.0))
        c.infer("add", _x(1.0), parameters={"k": 1})
        c.infer("add", _x(1.0), trace_context=given)
        c.infer("add", _x(1.0), parameters={protocol.TRACEPARENT: given})
        otel = types.ModuleType(OTEL_MODULE)
        otel.get_current_span = _Span  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, OTEL_MODULE, otel)
        c.infer("add", _x(1.0), parameters={"k": 1})
    plain, keyed, with_given, named, active = (r.parameters for r in server.infers)
    assert plain == {} and keyed == {"k": 1}
    assert with_given == {protocol.TRACEPARENT: given} and named == {protocol.TRACEPARENT: given}
    assert active == {"k": 1, protocol.TRACEPARENT: f"00-{0xAB:032x}-{0xCD:016x}-01"}


def test_inline_inputs_go_as_their_bytes_and_large_ones_as_views_of_them(url: str) -> None:
    """A small inline input's frame is its bytes (copied on its way out anyway); one of ``COPY_THRESHOLD``
    bytes or more is a flat view of the caller's array (sent without a copy)."""
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous: made so first
    large = np.arange(protocol.COPY_THRESHOLD, dtype=np.uint8)
    with Client(url, timeout=10, shm=False) as c:
        frames: list[Any] = []
        refs, _, _ = c._put_inputs({"S": small, "T": strided, "L": large}, [], frames, [])
    assert [r.frame for r in refs] == [0, 1, 2] and [r.shape for r in refs] == [(2, 3), (4, 3), large.shape]
    assert type(frames[0]) is bytes and frames[0] == small.tobytes()
    assert type(frames[1]) is bytes and frames[1] == np.ascontiguousarray(strided).tobytes()
    assert isinstance(frames[2], memoryview) and len(frames[2]) == large.nbytes
    assert np.shares_memory(np.frombuffer(frames[2], np.uint8), large)
