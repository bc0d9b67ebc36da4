"""The worker's input arrays straight over a frame or a region's range, and its output frames as one flat
byte view: the same arrays and bytes as the two-step paths they replace, read-only inputs, no copies, and the
same refusal of a frame that is not exactly the shape's bytes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from zinfer.client.protocol import COPY_THRESHOLD, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.workers.batch_io import emit, input_array
from zinfer.workers.regions import RegionCache


def test_an_inline_input_is_a_read_only_array_over_the_frame_itself() -> None:
    data = bytearray(np.arange(6, dtype=np.int32).tobytes())
    frame = memoryview(data)
    arr = input_array(TensorRef("X", "INT32", (2, 3), None, 0), [frame], RegionCache())
    assert arr.dtype == np.int32 and arr.shape == (2, 3)
    assert arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not arr.flags.writeable
    data[0] = 9  # a view of the frame, not a copy
    assert arr[0, 0] == 9


@pytest.mark.parametrize("extra", [-4, 4])
def test_a_frame_that_is_not_exactly_the_shapes_bytes_is_refused_as_before(extra: int) -> None:
    frame = memoryview(bytes(24 + extra))
    with pytest.raises(ValueError):
        input_array(TensorRef("X", "INT32", (2, 3), None, 0), [frame], RegionCache())


def test_other_frame_types_still_give_the_same_arrays() -> None:
    raw = np.arange(4, dtype=np.float32).tobytes()
    for frame in (raw, memoryview(np.arange(4, dtype=np.float32))):
        arr = input_array(TensorRef("X", "FP32", (4,), None, 0), [frame], RegionCache())
        assert arr.tolist() == [0.0, 1.0, 2.0, 3.0] and not arr.flags.writeable


def test_a_region_input_is_one_read_only_array_over_its_range() -> None:
    seg = Segment.create(64)
    try:
        np.frombuffer(seg.buf, np.float32)[:] = np.arange(16, dtype=np.float32)
        regions = RegionCache()
        try:
            ref = TensorRef("X", "FP32", (2, 2), ShmRef(seg.name, 16, 16))
            arr = input_array(ref, [], regions)
            assert arr.tolist() == [[4.0, 5.0], [6.0, 7.0]] and not arr.flags.writeable
            np.frombuffer(seg.buf, np.float32)[4] = 40.0  # over the mapping: no copy
            assert arr[0, 0] == 40.0
            short = TensorRef("X", "FP32", (2, 2), ShmRef(seg.name, 16, 12))  # not the shape's bytes
            with pytest.raises(ValueError):
                input_array(short, [], regions)
        finally:
            regions.close()
    finally:
        seg.close(unlink=True)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.arange(6, dtype=np.float32).reshape(3, 2).T,  # not C-contiguous: made so first
        np.zeros((0, 4), np.float32),  # no bytes
        np.array(7, np.int64),  # no dimensions
        np.arange(3).astype(ml_dtypes.bfloat16),  # no buffer format
        np.array([True, False]),
    ],
)
def test_an_output_frame_is_its_arrays_bytes_as_one_flat_byte_view(arr: np.ndarray) -> None:
    """A small output's frame is its bytes (it is copied on its way out anyway); a large one's
    (``COPY_THRESHOLD`` or more) is one flat byte view of the array, not a copy."""
    big = np.ascontiguousarray(np.broadcast_to(arr.reshape(-1)[:1], (COPY_THRESHOLD,))) if arr.size else None
    for value in (arr, big) if big is not None else (arr,):
        frames: list[bytes | memoryview] = []
        ref = emit("Y", value, None, "FP32", RegionCache(), frames)
        assert ref.frame == 0 and ref.shape == value.shape
        frame = frames[0]
        if value.nbytes < COPY_THRESHOLD:
            assert type(frame) is bytes
        else:
            assert isinstance(frame, memoryview) and frame.ndim == 1 and frame.format == "B"
            assert np.shares_memory(np.frombuffer(frame, np.uint8), value.view(np.uint8))
        assert len(frame) == memoryview(frame).nbytes == value.nbytes
        assert bytes(frame) == np.ascontiguousarray(value).tobytes()
