"""The client builds an INFER header straight from the caller's arrays (``_ClientBase._prepare``), without an
``InferRequest``: it must be exactly what ``protocol.infer_to_wire`` writes for the request it stands for,
and read back by the broker's decoder (``protocol.infer_from_wire``) as that request, for any mix of
dtypes, shapes, memory layouts, options, inline frames and shared-memory slots."""

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
from zinfer.client.protocol import InferRequest, OutputRequest, ShmRef, TensorRef
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
    header: dict[str, Any],
    rid: str,
    priority: int,
    timeout: int,
    params: dict[str, Any],
) -> InferRequest:
    """The request the header stands for, built field by field from what the call was given and where the
    client put each tensor (which ``header`` names: frame or slot)."""
    inputs = []
    for d, (name, arr) in zip(header["inputs"], arrays.items(), strict=True):
        shm = ShmRef(*d["shm"]) if "shm" in d else None
        inputs.append(TensorRef(name, dtypes.numpy_to_wire(arr.dtype), arr.shape, shm, d.get("frame")))
    outputs = tuple(
        OutputRequest(o["name"], ShmRef(*o["slot"]) if "slot" in o else None) for o in header["outputs"]
    )
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
        want = _expected(client, info, arrays, p.header, rid, priority, timeout, merged)
        assert p.header == protocol.infer_to_wire(want)
        got = protocol.infer_from_wire(p.header)
        assert got._replace(parameters=dict(got.parameters)) == want._replace(parameters=merged)
        assert [o["name"] for o in p.header["outputs"]] == (out_names or ["OUT0", "OUT1", "OUT2"])
        for d, arr in zip(p.header["inputs"], arrays.values(), strict=True):
            if arr.dtype == object:
                data = dtypes.serialize_bytes(arr)
            else:
                data = np.ascontiguousarray(arr).tobytes()
            if "frame" in d:
                assert bytes(p.frames[d["frame"]]) == data
                assert len(data) <= client.inline_threshold
            else:
                region, offset, nbytes = d["shm"]
                assert nbytes == len(data) > client.inline_threshold
                slot = next(s for s in p.slots if s.region == region and s.offset == offset)
                assert bytes(slot.view()[:nbytes]) == data
        batch = next(iter(arrays.values())).shape[0]  # the first input's first dimension
        big_out = batch * cols * 4 > client.inline_threshold
        # an output of unknown size gets a slot the size of the inputs in shared memory, from 4 KiB
        in_shm = sum(d["shm"][2] for d in p.header["inputs"] if "shm" in d)
        for o in p.header["outputs"]:
            sized = {"OUT0": big_out, "OUT1": False, "OUT2": in_shm >= 4096}  # BYTES: no size known
            assert ("slot" in o) == sized[o["name"]]
            if o["name"] == "OUT2" and "slot" in o:
                assert o["slot"][2] == in_shm
    finally:
        client._free(p.slots)
