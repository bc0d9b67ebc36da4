"""Per-request look-ups the broker does once: regions per EXECUTE, output sizes per signature, a step's
output map; and the drain of a ROUTER socket (its identity as bytes, the rest as buffers)."""

from __future__ import annotations

import numpy as np
import zmq

from zinfer.broker import drain as drain_mod
from zinfer.broker.ensemble_plan import PlanStep
from zinfer.broker.ensemble_run import output_row_bytes
from zinfer.broker.messages import execute_message
from zinfer.broker.model_state import Pending
from zinfer.client import protocol
from zinfer.client.protocol import Frame, OutputRequest, ShmRef
from zinfer.modelconfig.signature import Signature, TensorSpec


def _pending(seq: int, region: str) -> Pending:
    req = protocol.infer_from_wire({"id": "r", "model": "m", "version": 0,
                                    "inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 1],
                                                "shm": [region, 0, 4]}]})  # fmt: skip
    return Pending(seq, b"c", req, [], (OutputRequest("Y", ShmRef(region, 8, 4)),), 1, 0.0)


def test_execute_message_asks_each_region_once_found_or_not() -> None:
    asked: list[str] = []

    def region(name: str) -> list[int] | None:
        asked.append(name)
        return [3, 4, 5] if name == "client" else None  # "server": a server slot, no client region

    items = [_pending(i, "server") for i in range(1, 5)] + [_pending(5, "client"), _pending(6, "client")]
    message, _ = execute_message(1, items, region=region)
    assert sorted(asked) == ["client", "server"]  # once each, for six requests naming them twice each
    assert message.regions == {"client": (3, 4, 5)}


def _spec(name: str, wire: str, itemsize: int, dims: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(name, "TYPE_" + wire, wire, np.dtype(np.float32), itemsize, dims)


def test_output_row_bytes_per_signature() -> None:
    outs = {"F": _spec("F", "FP32", 4, (2, 3)), "V": _spec("V", "FP32", 4, (-1, 3)),
            "S": _spec("S", "BYTES", 0, (1,))}  # fmt: skip
    batched = Signature("m", 8, {}, outs)
    assert output_row_bytes(batched, "F") == (24, True)
    assert output_row_bytes(batched, "F") == (24, True)  # the second time from the cache
    assert output_row_bytes(batched, "V") == (-1, True)
    assert output_row_bytes(batched, "S") == (-1, True)
    assert output_row_bytes(batched, "missing") == (-1, True)
    alone = Signature("m", 0, {}, {"F": _spec("F", "FP32", 4, (5,))})
    assert output_row_bytes(alone, "F") == (20, False)  # another signature: its own sizes


def test_plan_step_maps_its_outputs() -> None:
    step = PlanStep(1, "m", 0, (("IN", "x"),), (("OUT", "y"), ("OUT2", "z")))
    assert step.tensor_of("OUT") == "y" and step.tensor_of("OUT2") == "z"
    assert step.tensor_of("IN") is None and step.tensor_of("other") is None


def test_drain_gives_identity_and_buffers_and_stops_at_the_bound() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        router.setsockopt(zmq.RCVTIMEO, 5000)
        dealer.setsockopt(zmq.IDENTITY, b"peer")
        router.bind("inproc://drain-test")
        dealer.connect("inproc://drain-test")
        got: list[tuple[bytes, list[bytes]]] = []

        def on(identity: bytes, frames: list[Frame]) -> None:
            got.append((identity, [bytes(f) for f in frames]))

        assert drain_mod.drain(router, on, b"T") is False  # nothing there: EAGAIN is no error
        dealer.send_multipart([b"env", b"tensor"])
        dealer.send(b"one")
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        assert poller.poll(5000)
        while len(got) < 2:  # the second message may not be there yet when the first is read
            drain_mod.drain(router, on, b"T")
            poller.poll(100)
        assert got == [(b"Tpeer", [b"env", b"tensor"]), (b"Tpeer", [b"one"])]
        got.clear()
        for i in range(drain_mod.MAX_PER_TURN + 1):
            dealer.send(b"%d" % i)
        assert poller.poll(5000)  # over inproc every message is there once the first is
        assert drain_mod.drain(router, on, b"") is True  # the bound: one turn, and more is there
        assert len(got) == drain_mod.MAX_PER_TURN
        assert drain_mod.drain(router, on, b"") is False
        assert [frames[0] for _, frames in got] == [b"%d" % i for i in range(drain_mod.MAX_PER_TURN + 1)]
    finally:
        dealer.close(0)
        router.close(0)
        ctx.term()
