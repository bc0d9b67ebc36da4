"""The client builds an INFER header straight from the caller's arrays (``_ClientBase._prepare``) as the
declared record, ``InferRequest``: it must be the request the call stands for, go on the wire as exactly
the bytes ``protocol.infer_to_wire``'s map encodes to, and be read back from those bytes by the broker's
decoder as that request, for any mix of dtypes, shapes, memory layouts, options, inline frames and
shared-memory slots."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zinfer.client import dtypes, protocol
from zinfer.client.base import _ClientBase, _ModelInfo, _OutputSpec
from zinfer.client.protocol import Command, InferRequest, OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment

DTYPES = ["float32", "float16", "int8", "int64", "uint16", "bool", "object"]


class _Offline(_ClientBase):
    """The request building of either client, with no server: new arena segments are not registered."""

    def _on_new_segment(self, seg: Segment) -> None:
        pass


@pytest.fixture(scope="module")
def client() -> Iterator[_ClientBase]:
    c = _Offline(
        f"ipc:///tmp/zinfer-header-test-{os.getpid()}.sock",  # never connected: nothing is sent
        timeout=5.0,
        shm=True,
        arena_bytes=1 << 20,
        max_arena_bytes=1 << 22,
        inline_threshold=256,
    )
    yield c
    if c._arena is not None:
        c._arena.close()  # its /dev/shm segments go with it


def _array(kind: str, shape: tuple[int, ...], transposed: bool) -> np.ndarray[Any, Any]:
    if kind == "object":
        return np.array([f"s{i}".encode() for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    arr = np.arange(int(np.prod(shape)), dtype=np.int64).astype(kind).reshape(shape)
    return arr.T if transposed and arr.ndim > 1 else arr


def _expected(
    c: _ClientBase,
    info: _ModelInfo,
    arrays: dict[str, Any],
    header: InferRequest,
    rid: str,
    priority: int,
    timeout: int,
    params: dict[str, Any],
) -> InferRequest:
    """The request the header stands for, built field by field from what the call was given and where the
    client put each tensor (which ``header`` names: frame or slot)."""
    inputs = []
    for t, (name, arr) in zip(header.inputs, arrays.items(), strict=True):
        shm = None if t.shm is None else ShmRef(*t.shm)
        inputs.append(TensorRef(name, dtypes.numpy_to_wire(arr.dtype), arr.shape, shm, t.frame))
    assert header.outputs is not None
    outputs = tuple(OutputRequest(o.name, o.slot and ShmRef(*o.slot)) for o in header.outputs)
    return InferRequest(rid, info.name, info.version, tuple(inputs), outputs, priority, timeout, params, rid)


@settings(max_examples=150, deadline=None)
@example(  # 2,880 + 1,440 input bytes in shared memory: OUT2 (size unknown) gets a slot that size
    kinds=["int64", "float32"],
    rows=40,
    cols=9,
    transposed=False,
    rid="",
    priority=0,
    timeout=0,
    sequence=(0, False, False),
    params=None,
    out_names=None,
)
@given(
    kinds=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3),
    rows=st.integers(1, 80),
    cols=st.integers(1, 9),
    transposed=st.booleans(),
    rid=st.sampled_from(["", "req-7"]),
    priority=st.integers(0, 3),
    timeout=st.sampled_from([0, 0, 1500]),
    sequence=st.sampled_from([(0, False, False), (9, True, False), ("s", False, True), ("", False, False)]),
    params=st.sampled_from([None, {}, {"k": 1, "flag": True}]),
    out_names=st.sampled_from([None, ["OUT0"], ["OUT1", "OUT0"], ["OUT2"]]),
)
def test_the_header_is_what_infer_to_wire_writes_and_the_broker_reads_it_back(
    client: _ClientBase,
    kinds: list[str],
    rows: int,
    cols: int,
    transposed: bool,
    rid: str,
    priority: int,
    timeout: int,
    sequence: tuple[Any, bool, bool],
    params: dict[str, Any] | None,
    out_names: list[str] | None,
) -> None:
    outs = (_OutputSpec("OUT0", "FP32", (-1, cols)), _OutputSpec("OUT1", "BYTES", (-1,)))
    info = _ModelInfo("m", 2, 64, (*outs, _OutputSpec("OUT2", "INT32", (-1, -1))))
    arrays = {f"IN{i}": _array(k, (rows, cols), transposed) for i, k in enumerate(kinds)}
    p = client._prepare(info, arrays, out_names, rid or None, priority, timeout or None, sequence, params)
    try:
        seq = dict(zip(("sequence_id", "sequence_start", "sequence_end"), sequence, strict=True))
        merged = {**(params or {}), **({} if sequence in ((0, False, False), ("", False, False)) else seq)}
        header = p.header
        assert type(header) is InferRequest
        want = _expected(client, info, arrays, header, rid, priority, timeout, merged)
        assert header._replace(parameters=dict(header.parameters)) == want._replace(parameters=merged)
        wire = protocol.encode(Command.INFER, header, p.frames)
        assert wire == protocol.encode(Command.INFER, protocol.infer_to_wire(want), p.frames)  # byte for byte
        fast = protocol.decode_infer(wire)  # as the broker reads it: straight from the bytes
        assert fast is not None and type(fast.record) is InferRequest
        got = fast.record
        assert got._replace(parameters=dict(got.parameters)) == want._replace(parameters=merged)
        assert [bytes(f) for f in fast.frames] == [bytes(f) for f in p.frames]
        assert protocol.infer_from_wire(protocol.decode(wire).header) == got  # and through the map
        assert header.outputs is not None
        assert [o.name for o in header.outputs] == (out_names or ["OUT0", "OUT1", "OUT2"])
        for t, arr in zip(header.inputs, arrays.values(), strict=True):
            if arr.dtype == object:
                data = dtypes.serialize_bytes(arr)
            else:
                data = np.ascontiguousarray(arr).tobytes()
            if t.frame is not None:
                assert bytes(p.frames[t.frame]) == data
                assert len(data) <= client.inline_threshold
            else:
                assert t.shm is not None
                region, offset, nbytes = t.shm
                assert nbytes == len(data) > client.inline_threshold
                slot = next(s for s in p.slots if s.region == region and s.offset == offset)
                assert bytes(slot.view()[:nbytes]) == data
        batch = next(iter(arrays.values())).shape[0]  # the first input's first dimension
        big_out = batch * cols * 4 > client.inline_threshold
        # an output of unknown size gets a slot the size of the inputs in shared memory, from 4 KiB
        in_shm = sum(t.shm.nbytes for t in header.inputs if t.shm is not None)
        for o in header.outputs:
            sized = {"OUT0": big_out, "OUT1": False, "OUT2": in_shm >= 4096}  # BYTES: no size known
            assert (o.slot is not None) == sized[o.name]
            if o.name == "OUT2" and o.slot is not None:
                assert o.slot.nbytes == in_shm
    finally:
        client._free(p.slots)
