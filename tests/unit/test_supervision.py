"""Pure pieces of the broker: the restart policy and the EXECUTE message builder."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.broker.messages import execute_message, reply_outputs
from zinfer.broker.model_state import Pending
from zinfer.broker.supervisor import RestartPolicy, WorkerSpec
from zinfer.client import protocol
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.client.worker_protocol import execute_from_wire, execute_to_wire

SPEC = WorkerSpec("m", 1, 0, "cpu", Path("/repo"), "ipc:///x")


def test_restart_backoff_grows_then_gives_up() -> None:
    policy = RestartPolicy(backoff=(1.0, 2.0, 4.0), window=60.0)
    assert policy.crashed(SPEC, now=0.0) is None
    assert policy.due(0.5) == []
    assert policy.due(1.0) == [SPEC]
    assert policy.crashed(SPEC, now=10.0) is None
    assert policy.due(11.0) == [] and policy.due(12.0) == [SPEC]
    assert policy.crashed(SPEC, now=20.0) is None
    assert policy.due(24.0) == [SPEC]
    assert policy.crashed(SPEC, now=30.0) == 3  # a fourth crash within the minute: give up
    assert policy.due(100.0) == []


def test_old_crashes_leave_the_window() -> None:
    policy = RestartPolicy(backoff=(1.0, 2.0), window=60.0)
    assert policy.crashed(SPEC, 0.0) is None
    assert policy.crashed(SPEC, 10.0) is None
    assert policy.crashed(SPEC, 100.0) is None  # the first two are more than a minute old
    assert policy.due(101.0) == [SPEC, SPEC, SPEC]


def _pending(seq: int, inputs: list[dict[str, object]], frames: list[bytes], caller_id: str = "") -> Pending:
    req = protocol.infer_from_wire(
        {"id": "r", "model": "m", "version": 0, "inputs": inputs, "caller_id": caller_id}
    )
    return Pending(seq, b"c", req, list(frames), (protocol.OutputRequest("Y"),), 1, 0.0)


def test_execute_message_renumbers_inline_frames_only() -> None:
    shm = {"name": "A", "datatype": "FP32", "shape": [1, 1], "shm": ["r", 0, 4]}
    inline = {"name": "B", "datatype": "FP32", "shape": [1, 1]}
    a = _pending(1, [shm, {**inline, "frame": 0}], [b"b1"], caller_id="client-7")
    b = _pending(2, [{**inline, "name": "A", "frame": 1}, {**inline, "frame": 0}], [b"b2", b"a2"])
    message, frames = execute_message(7, [a, b], region=lambda name: [3, 4, 5])
    assert message.batch == 7 and message.regions == {"r": (3, 4, 5)}
    assert [r.id for r in message.requests] == [1, 2]
    assert [r.request_id for r in message.requests] == ["client-7", ""]  # the id its client gave it
    assert message.requests[0].inputs[0] == TensorRef("A", "FP32", (1, 1), shm=ShmRef("r", 0, 4))
    assert message.requests[0].inputs[1].frame == 0
    assert [t.frame for t in message.requests[1].inputs] == [1, 2]
    assert message.requests[0].outputs == (OutputRequest("Y"),)
    assert frames == [b"b1", b"a2", b"b2"]
    assert execute_from_wire(execute_to_wire(message)) == message


def test_reply_outputs_renumbers_from_zero() -> None:
    outs, frames = reply_outputs(
        [TensorRef("Y", "FP32", (1,), frame=3), TensorRef("Z", "FP32", (1,), shm=ShmRef("r", 0, 4))],
        [b"0", b"1", b"2", b"3"],
    )
    assert outs == [{"name": "Y", "datatype": "FP32", "shape": [1], "frame": 0},
                    {"name": "Z", "datatype": "FP32", "shape": [1], "shm": ["r", 0, 4]}]  # fmt: skip
    assert frames == [b"3"]


def test_reply_outputs_are_the_records_maps_with_frames_from_zero() -> None:
    """Each output is ``tensor_to_wire`` of its record, its inline frame renumbered in the order they
    come; a frame the worker's result does not have is refused."""
    frames = [b"0", b"1", b"2", b"3"]
    records = [
        TensorRef("Y", "FP32", (1, 2), frame=3),
        TensorRef("Z", "INT8", (4,), shm=ShmRef("r", 0, 4)),
        TensorRef("W", "BYTES", (), frame=1),
    ]
    maps = [protocol.tensor_to_wire(t) for t in records]
    maps[0]["frame"], maps[2]["frame"] = 0, 1
    assert reply_outputs(records, frames) == (maps, [b"3", b"1"])
    for bad in (4, -1):
        with pytest.raises(InvalidArgument, match="names a missing frame"):
            reply_outputs([TensorRef("Y", "FP32", (1,), frame=bad)], frames)
