"""A reply's inline outputs read into arrays by the client: over exactly the shape's bytes (the usual, made
in one call) and over frames that are longer or shorter than the shape says, as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from zinfer.client import dtypes
from zinfer.client.base import _ClientBase
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Reply, Status


def _client() -> _ClientBase:
    return _ClientBase(None, timeout=1.0, shm=False, arena_bytes=0, max_arena_bytes=0, inline_threshold=0)


def _read(frame: Any, shape: list[int], datatype: str = "FP32") -> np.ndarray:
    body = {"model": "m", "version": 1, "outputs": [{"name": "Y", "datatype": datatype, "shape": shape,
                                                     "frame": 0}]}  # fmt: skip
    result = _client()._read_outputs(Reply("r", Status.OK, body=body), [frame], {}, "")
    return result.as_numpy("Y")


@pytest.mark.parametrize("shape", [[1, 1], [2, 3], [0, 4], [5]])
def test_exact_frame_is_the_array(shape: list[int]) -> None:
    want = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    got = _read(memoryview(want.tobytes()), shape)
    assert got.shape == tuple(shape) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable  # over the reply's (read-only) bytes, as before


def test_writable_frame_gives_a_writable_array_as_before() -> None:
    got = _read(memoryview(bytearray(np.ones(2, np.float32).tobytes())), [1, 2])
    assert got.flags.writeable
    np.testing.assert_array_equal(got, [[1.0, 1.0]])


def test_longer_frame_gives_the_first_elements() -> None:
    got = _read(memoryview(np.arange(6, dtype=np.float32).tobytes()), [2, 2])
    np.testing.assert_array_equal(got, [[0.0, 1.0], [2.0, 3.0]])


def test_shorter_frame_is_refused() -> None:
    with pytest.raises(ValueError):
        _read(memoryview(np.arange(3, dtype=np.float32).tobytes()), [2, 2])


def test_int64_and_fp16_outputs() -> None:
    for datatype, dtype in (("INT64", np.int64), ("FP16", np.float16)):
        want = np.arange(4, dtype=dtype).reshape(2, 2)
        got = _read(memoryview(want.tobytes()), [2, 2], datatype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("datatype", sorted(dtypes.WIRE_TYPES - {dtypes.BYTES}))
def test_every_wire_type_reads_as_its_dtype(datatype: str) -> None:
    """The client's table of wire types (read per reply without calling ``dtypes``) gives what
    ``dtypes.wire_to_numpy`` gives, for frames as memoryviews and as bytes."""
    dtype = dtypes.wire_to_numpy(datatype)
    want = np.arange(6).astype(dtype).reshape(2, 3)
    for frame in (memoryview(want.tobytes()), want.tobytes()):
        got = _read(frame, [2, 3], datatype)
        assert got.dtype == dtype and got.shape == (2, 3)
        np.testing.assert_array_equal(got, want)


def test_a_memoryview_frame_is_read_where_it_lies() -> None:
    blob = bytearray(np.arange(4, dtype=np.float32).tobytes())
    got = _read(memoryview(blob), [2, 2])
    blob[:4] = np.float32(9).tobytes()  # the array is a view of the reply's bytes, not a copy
    assert got[0, 0] == 9.0


def test_an_unknown_output_type_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="unknown data type 'FP8'"):
        _read(memoryview(b"\0" * 4), [1, 1], "FP8")
