"""Level TENSORS' entries: Triton's trace-file form, and every size bounded whatever the request claims."""

from __future__ import annotations

import struct

import numpy as np

from zinfer.broker.trace_tensors import (
    MAX_ELEMENTS,
    MAX_TENSORS,
    MAX_TEXT,
    as_backend_inputs,
    input_entries,
    output_entries,
    tensor_entry,
)
from zinfer.client.dtypes import serialize_bytes
from zinfer.client.protocol import ShmRef, TensorRef


def test_numbers_in_tritons_form() -> None:
    data = np.array([[0.1, 2.5, -3.0]], np.float32).tobytes()
    e = tensor_entry(7, "TENSOR_QUEUE_INPUT", "X", "FP32", (1, 3), data)
    assert e == {"id": 7, "activity": "TENSOR_QUEUE_INPUT",
                 "tensor": {"name": "X", "data": "0.1,2.5,-3", "shape": "1,3", "dtype": "FP32"}}  # fmt: skip
    out = "TENSOR_BACKEND_OUTPUT"
    ints = tensor_entry(1, out, "I", "INT64", (2,), np.array([5, -6], np.int64).tobytes())
    assert ints["tensor"]["data"] == "5,-6"
    flags = tensor_entry(1, out, "B", "BOOL", (3,), np.array([1, 0, 1], np.bool_).tobytes())
    assert flags["tensor"]["data"] == "1,0,1"
    bf = tensor_entry(1, out, "H", "BF16", (2,), np.array([0x3F80, 0xC000], np.uint16).tobytes())
    assert bf["tensor"]["data"] == "1,-2"


def test_bytes_elements_as_text_each_bounded() -> None:
    data = serialize_bytes(np.array([b"abc", b"x" * (MAX_TEXT * 3), "\u00e9".encode()], dtype=object))
    e = tensor_entry(1, "TENSOR_QUEUE_INPUT", "T", "BYTES", (3,), data)
    first, long, accent = e["tensor"]["data"].split(",")
    assert first == "abc" and long == "x" * MAX_TEXT and accent == "\u00e9"
    # a length that runs past the buffer ends the list; nothing raises
    bad = struct.pack("<I", 1 << 30) + b"zz"
    assert tensor_entry(1, "TENSOR_QUEUE_INPUT", "T", "BYTES", (1,), bad)["tensor"]["data"] == ""


def test_a_huge_claimed_shape_reads_only_what_is_bounded() -> None:
    big = np.arange(MAX_ELEMENTS * 4, dtype=np.float32).tobytes()
    e = tensor_entry(1, "TENSOR_QUEUE_INPUT", "X", "FP32", (1 << 40,), big)
    t = e["tensor"]
    assert t["truncated"] is True and t["elements"] == 1 << 40 and t["shape"] == str(1 << 40)
    assert len(t["data"].split(",")) == MAX_ELEMENTS
    # a buffer shorter than the shape says: only the elements there, no read past it
    short = tensor_entry(1, "TENSOR_QUEUE_INPUT", "X", "FP32", (10,), np.ones(3, np.float32).tobytes())
    assert short["tensor"]["data"] == "1,1,1"


def test_inputs_from_frames_and_regions_reads_bounded_ranges() -> None:
    asked: list[ShmRef] = []
    region = np.arange(MAX_ELEMENTS * 2, dtype=np.int32).tobytes()

    def read(ref: ShmRef) -> memoryview | None:
        asked.append(ref)
        if ref.region != "r":
            return None
        return memoryview(region)[ref.offset : ref.offset + ref.nbytes]

    inputs = [
        TensorRef("A", "INT32", (2,), frame=0),
        TensorRef("B", "INT32", (MAX_ELEMENTS * 2,), shm=ShmRef("r", 0, len(region))),
        TensorRef("C", "INT32", (1,), shm=ShmRef("gone", 0, 4)),
        TensorRef("D", "INT32", (1,), frame=9),  # a frame that is not there
    ]
    got = input_entries(3, inputs, [np.array([4, 5], np.int32).tobytes()], read)
    by = {e["tensor"]["name"]: e["tensor"] for e in got}
    assert by["A"]["data"] == "4,5"
    assert by["B"]["truncated"] and by["B"]["data"].startswith("0,1,2,")
    assert asked[0].nbytes == MAX_ELEMENTS * 4  # only the elements written are read
    assert by["C"]["unreadable"] and by["D"]["unreadable"]
    assert [e["activity"] for e in as_backend_inputs(got)] == ["TENSOR_BACKEND_INPUT"] * 4


def test_outputs_skip_malformed_and_bound_the_count() -> None:
    frames = [np.array([1.5], np.float32).tobytes()]
    outs = [{"name": "Y", "datatype": "FP32", "shape": [1], "frame": 0},
            {"name": "bad"}, {"name": "Z", "datatype": "FP32", "shape": ["x"], "frame": 0}]  # fmt: skip
    got = output_entries(2, outs, frames, lambda ref: None)
    assert [e["tensor"]["name"] for e in got] == ["Y"] and got[0]["tensor"]["data"] == "1.5"
    many = [{"name": f"o{i}", "datatype": "FP32", "shape": [1], "frame": 0} for i in range(MAX_TENSORS * 3)]
    assert len(output_entries(2, many, frames, lambda ref: None)) == MAX_TENSORS
