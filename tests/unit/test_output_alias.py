"""An output that is an input's memory, unchanged (an identity model), named where it is instead of copied.

The client allows it per output (``OutputRequest.alias``) only where every input in shared memory is an array
of its own that it keeps as long as the output lives (the door's arena arrays). The worker then names the
input's range as the output's (``batch_io.emit``); otherwise it copies into the slot, as before. The client
takes such a reply only for a range wholly inside one of those inputs: any other range, another region, a
range beside its own slot, or an alias the request did not allow, is refused as shared memory the request
did not reserve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from zinfer.client import protocol
from zinfer.client.base import _Prepared
from zinfer.client.errors import ProtocolError, Status
from zinfer.client.protocol import InferRequest, OutputRequest, Reply, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.frontdoor.door_client import DoorClient
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.workers.batch_io import emit
from zinfer.workers.kernels import IdentityKernel
from zinfer.workers.regions import RegionCache

# ------------------------------------------------------------------------------------------------ the wire


def test_the_alias_flag_crosses_the_wire_and_is_absent_by_default() -> None:
    plain = OutputRequest("Y", ShmRef("r", 0, 8))
    assert "alias" not in protocol.output_to_wire(plain)
    allowed = OutputRequest("Y", ShmRef("r", 0, 8), True)
    wire = protocol.output_to_wire(allowed)
    assert wire["alias"] is True
    assert protocol.output_from_wire(wire) == allowed
    assert protocol.output_from_wire(protocol.output_to_wire(plain)) == plain


@pytest.mark.parametrize("bad", [1, "yes", None, [True]])
def test_an_alias_flag_that_is_not_a_boolean_is_refused(bad: Any) -> None:
    with pytest.raises(ProtocolError, match="alias"):
        protocol.output_from_wire({"name": "Y", "alias": bad})


# ------------------------------------------------------------------------------------------------ the worker


@pytest.fixture
def region() -> Iterator[tuple[Segment, RegionCache]]:
    seg = Segment.create(4096)
    regions = RegionCache()
    try:
        yield seg, regions
    finally:
        regions.close()
        seg.close(unlink=True)


def _input(seg: Segment, regions: RegionCache, offset: int, count: int) -> tuple[TensorRef, np.ndarray]:
    from zinfer.workers.batch_io import input_array

    np.frombuffer(seg.buf, np.float32, count, offset)[:] = np.arange(count, dtype=np.float32)
    ref = TensorRef("X", "FP32", (count,), ShmRef(seg.name, offset, count * 4))
    return ref, input_array(ref, [], regions)


def test_an_identity_output_names_its_inputs_range_when_the_client_allows_it(
    region: tuple[Segment, RegionCache],
) -> None:
    seg, regions = region
    ref, arr = _input(seg, regions, 256, 64)
    slot = ShmRef(seg.name, 2048, 256)
    out = emit("Y", arr, slot, "FP32", regions, [], alias_from=(ref,))
    assert out.shm == ref.shm and out.frame is None  # no copy: the slot is left untouched
    assert not np.frombuffer(seg.buf, np.float32, 64, 2048).any()
    middle = emit("Y", arr[8:24], slot, "FP32", regions, [], alias_from=(ref,))  # a contiguous part of it
    assert middle.shm == ShmRef(seg.name, 256 + 32, 64)


def test_an_output_that_is_not_an_inputs_memory_is_copied_into_its_slot(
    region: tuple[Segment, RegionCache],
) -> None:
    seg, regions = region
    ref, arr = _input(seg, regions, 256, 64)
    slot = ShmRef(seg.name, 2048, 256)
    cases = [
        arr.copy(),  # the same values elsewhere (a writable array: no address looked at)
        np.asarray(arr.copy(), order="C").copy(),
        arr.reshape(8, 8).T,  # the input's memory, but not in order
    ]
    ro = arr.copy()
    ro.flags.writeable = False  # read-only, elsewhere
    cases.append(ro)
    for piece in cases:
        out = emit("Y", piece, slot, "FP32", regions, [], alias_from=(ref,))
        assert out.shm == ShmRef(seg.name, 2048, piece.nbytes)
        np.testing.assert_array_equal(np.frombuffer(seg.buf, np.float32, piece.size, 2048), piece.reshape(-1))


def test_without_the_clients_leave_the_input_is_copied(region: tuple[Segment, RegionCache]) -> None:
    seg, regions = region
    _, arr = _input(seg, regions, 256, 64)
    out = emit("Y", arr, ShmRef(seg.name, 2048, 256), "FP32", regions, [])
    assert out.shm == ShmRef(seg.name, 2048, 256)
    np.testing.assert_array_equal(np.frombuffer(seg.buf, np.float32, 64, 2048), np.arange(64))


def test_the_identity_kernel_returns_its_inputs_themselves() -> None:
    config = parse_model_config(
        'name: "i" backend: "zinfer" max_batch_size: 4\n'
        'input [ { name: "A" data_type: TYPE_INT64 dims: [ -1 ] }, '
        '{ name: "B" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
        'output [ { name: "X" data_type: TYPE_INT64 dims: [ -1 ] }, '
        '{ name: "Y" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
        'parameters { key: "kernel" value: { string_value: "identity" } }',
        source="test",
        model_name="i",
    )
    kernel = IdentityKernel(config, None)  # a real one (compiled, a native class: no bare __new__)
    a, b = np.arange(4), np.arange(3)
    out = kernel.execute({"A": a, "B": b}, lambda *_: np.zeros(4))  # an offered slot is not used
    assert out["X"] is a and out["Y"] is b


# ------------------------------------------------------------------------------------------------ the client


@pytest.fixture
def client() -> Iterator[DoorClient]:
    c = DoorClient("ipc:///nonexistent-zinfer-test")  # never connects: only its reply reading is used
    try:
        yield c
    finally:
        asyncio.run(c.close())


def _prepared(alias: bool, slots: list[Any] | None = None) -> tuple[_Prepared, np.ndarray]:
    kept = np.arange(64, dtype=np.float32)  # the door's own input array, sent where it is
    inputs = (TensorRef("X", "FP32", (64,), ShmRef("seg", 1024, 256)),)
    outputs = (OutputRequest("Y", ShmRef("seg", 4096, 256), alias),)
    header = InferRequest("", "m", 1, inputs, outputs)
    return _Prepared(header, [], slots or [], {}, "", keep=[kept]), kept


def _reply(shm: list[Any], datatype: str = "FP32", shape: list[int] | None = None) -> Reply:
    tensor = {"name": "Y", "datatype": datatype, "shape": shape or [len_of(shm, datatype)], "shm": shm}
    return Reply("1", Status.OK, body={"model": "m", "version": 1, "outputs": [tensor]})


def len_of(shm: list[Any], datatype: str) -> int:
    return int(shm[2]) // (4 if datatype == "FP32" else 1)


def test_the_door_takes_an_output_named_inside_its_own_input_as_a_view_of_it(client: DoorClient) -> None:
    p, kept = _prepared(alias=True)
    reply = client._reply_of(p, _reply(["seg", 1024 + 16, 64]), [], "")
    (t,) = reply.outputs
    np.testing.assert_array_equal(t.data, np.arange(4, 20, dtype=np.float32))
    assert np.shares_memory(t.data, kept)  # no copy: it keeps the input's memory alive


@pytest.mark.parametrize(
    "shm",
    [
        ["seg", 1024, 260],  # past the input's end
        ["seg", 1020, 8],  # starts before it
        ["seg", 1024 + 256, 4],  # just after it
        ["other", 1024, 64],  # another region at the same place
        ["seg", 4096 + 4, 64],  # inside the output's own slot's region, not at the slot
    ],
)
def test_a_range_outside_the_requests_inputs_is_refused(shm: list[Any], client: DoorClient) -> None:
    p, _ = _prepared(alias=True)
    with pytest.raises(ProtocolError, match="did not reserve"):
        client._reply_of(p, _reply(shm), [], "")


def test_an_alias_the_request_did_not_allow_is_refused(client: DoorClient) -> None:
    p, _ = _prepared(alias=False)
    with pytest.raises(ProtocolError, match="did not reserve"):
        client._reply_of(p, _reply(["seg", 1024, 256]), [], "")


def test_a_bytes_output_named_inside_an_input_is_refused(client: DoorClient) -> None:
    p, _ = _prepared(alias=True)
    with pytest.raises(ProtocolError, match="did not reserve"):
        client._reply_of(p, _reply(["seg", 1024, 16], "BYTES", [1]), [], "")


def test_a_range_beside_the_outputs_own_slot_is_refused_and_the_slot_itself_read(
    client: DoorClient,
) -> None:
    from zinfer.client.arena import Slot

    seg = Segment.create(8192)
    try:
        np.frombuffer(seg.buf, np.float32, 64, 4096)[:] = np.arange(64, dtype=np.float32)
        slot = Slot(seg, 4096, 256)
        for alias in (False, True):
            p, _ = _prepared(alias)
            p.slots, p.out_slots = [slot], {"Y": slot}
            with pytest.raises(ProtocolError, match="did not reserve"):  # same region, not at the slot
                client._reply_of(p, _reply([seg.name, 4096 + 4, 64]), [], "")
            (t,) = client._reply_of(p, _reply([seg.name, 4096, 64]), [], "").outputs
            np.testing.assert_array_equal(t.data, np.arange(16, dtype=np.float32))
            del t
    finally:
        seg.close(unlink=True)
