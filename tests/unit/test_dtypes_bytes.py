"""``BYTES`` tensors on the wire (``client.dtypes``): each element a 4-byte little-endian length, then its
bytes. The one-element shortcut of both directions must give what the element-by-element path gives, and a
buffer that does not hold exactly the shape's elements is refused with the same texts either way."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument


def _by_hand(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


@given(st.lists(st.binary(max_size=40), min_size=0, max_size=6))
def test_serialize_matches_the_layout(items: list[bytes]) -> None:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    assert dtypes.serialize_bytes(arr) == _by_hand(items)


@given(st.binary(max_size=64), st.sampled_from([(1,), (1, 1), (), (1, 1, 1)]))
def test_one_element_round_trip(item: bytes, shape: tuple[int, ...]) -> None:
    arr = np.empty(1, dtype=object)
    arr[0] = item
    arr = arr.reshape(shape)
    wire = dtypes.serialize_bytes(arr)
    assert wire == _by_hand([item])
    for buf in (wire, memoryview(wire), memoryview(bytearray(wire))):
        out = dtypes.deserialize_bytes(buf, shape)
        assert out.shape == shape and out.dtype == object
        assert type(out.reshape(-1)[0]) is bytes and out.reshape(-1)[0] == item


@given(st.lists(st.binary(max_size=20), min_size=2, max_size=8))
def test_many_elements_round_trip(items: list[bytes]) -> None:
    out = dtypes.deserialize_bytes(_by_hand(items), (len(items), 1))
    assert out.shape == (len(items), 1)
    assert [bytes(x) for x in out.reshape(-1)] == items


def test_str_and_bytes_arrays_encode_their_elements() -> None:
    assert dtypes.serialize_bytes(np.array(["héllo"])) == _by_hand(["héllo".encode()])
    assert dtypes.serialize_bytes(np.array([[b"ab"]], dtype=np.bytes_)) == _by_hand([b"ab"])
    assert dtypes.serialize_bytes(np.array(["a", "bc"], dtype=object)) == _by_hand([b"a", b"bc"])
    assert dtypes.serialize_bytes(np.empty(0, dtype=object)) == b""


def test_one_element_is_a_copy_not_a_view() -> None:
    wire = bytearray(_by_hand([b"abc"]))
    out = dtypes.deserialize_bytes(memoryview(wire), (1, 1))
    wire[4:7] = b"xyz"  # the caller's buffer changes after: the tensor does not
    assert out[0, 0] == b"abc"
    out[0, 0] = b"new"  # and it is the caller's to change
    assert out[0, 0] == b"new"


@pytest.mark.parametrize(
    ("buf", "shape", "text"),
    [
        (b"", (1,), "shorter than its shape says"),
        (b"\x01\x00", (1, 1), "shorter than its shape says"),
        (struct.pack("<I", 5) + b"abc", (1,), "runs past the end"),
        (struct.pack("<I", 2) + b"abc", (1,), "left over"),
        (struct.pack("<I", 0xFFFFFFFF) + b"abc", (1, 1), "runs past the end"),
        (_by_hand([b"a", b"b"]), (1,), "left over"),
        (_by_hand([b"a"]), (2,), "shorter than its shape says"),
        (_by_hand([b"a", b"b"]), (1, 1), "left over"),
        (_by_hand([b"a"]) + b"\x00", (1,), "left over"),
    ],
)
def test_a_buffer_that_is_not_the_shape_is_refused(buf: bytes, shape: tuple[int, ...], text: str) -> None:
    with pytest.raises(InvalidArgument, match=text):
        dtypes.deserialize_bytes(buf, shape)
