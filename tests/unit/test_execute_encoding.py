"""An EXECUTE encoded from its record (``worker_protocol.encode_execute``, what the broker sends) reads back,
in the worker's typed path and in the checked map path, as the same record and frames as the map that
``execute_to_wire`` writes, packed or not."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import protocol
from zinfer.client import worker_protocol as wp
from zinfer.client.framing import COPY_THRESHOLD
from zinfer.client.protocol import Command, OutputRequest, ShmRef, TensorRef

TEXT = st.characters(blacklist_categories=("Cs",))
names = st.text(TEXT, min_size=1, max_size=12)
u63 = st.integers(0, (1 << 63) - 1)
u64 = st.integers(0, (1 << 64) - 1)
shm_refs = st.builds(ShmRef, names, u63, u63)
tensors = st.builds(
    lambda name, dtype, shape, where: TensorRef(name, dtype, tuple(shape), *where),
    names,
    names,
    st.lists(st.integers(0, (1 << 40) - 1), max_size=4),
    st.one_of(shm_refs.map(lambda s: (s, None)), st.integers(0, 3).map(lambda f: (None, f))),
)
controls = st.builds(
    wp.SequenceControl,
    names,
    st.sampled_from(sorted(wp.CONTROL_KINDS)),
    names,
    st.lists(st.booleans() | st.integers(-5, 5), max_size=2).map(tuple),
)
sequences = st.builds(
    wp.SequenceFlags, u64 | st.text(TEXT, max_size=8), st.booleans(), st.booleans(),
    st.lists(controls, max_size=2).map(tuple),
)  # fmt: skip
scalars = st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.floats(allow_nan=False) | names
requests = st.builds(
    wp.ExecuteRequest,
    u63,
    st.lists(tensors, max_size=3).map(tuple),
    st.lists(st.builds(OutputRequest, names, st.none() | shm_refs), max_size=2).map(tuple),
    st.text(TEXT, max_size=8),
    st.none() | sequences,
    st.just(wp.NO_PARAMETERS) | st.dictionaries(names, scalars, min_size=1, max_size=3),
)
executes = st.builds(
    wp.Execute,
    u63,
    st.lists(requests, max_size=3).map(tuple),
    st.just(wp.NO_REGIONS) | st.dictionaries(names, st.tuples(u64, u64, u64), min_size=1, max_size=2),
    st.booleans(),
)
frame_sets = st.lists(st.sampled_from([b"", b"\x01\x02\x03\x04", b"\x00" * COPY_THRESHOLD]), max_size=4)


def _read(frames: list[Any]) -> tuple[wp.Execute, wp.Execute, list[bytes]]:
    """The record as the worker reads it (typed), as the checked path reads it, and the inline frames."""
    typed = wp.decode_execute(frames)
    assert typed is not None
    msg = protocol.decode(frames)
    assert msg.command == Command.W_EXECUTE
    inline = [bytes(f) for f in msg.frames]
    return wp.execute_from_wire(typed.record), wp.execute_from_wire(msg.header), inline


@settings(max_examples=300, deadline=None)
@given(executes, frame_sets)
def test_an_execute_encoded_from_its_record_reads_back_as_the_map_encoding_does(
    e: wp.Execute, frames: list[bytes]
) -> None:
    from_record = _read(wp.encode_execute(e, frames))
    from_map = _read(protocol.encode(Command.W_EXECUTE, wp.execute_to_wire(e), frames))
    assert from_record == from_map
    typed, checked, inline = from_record
    assert typed == e and checked == e
    assert inline == frames


def test_empty_parameters_and_regions_are_left_out_of_the_bytes() -> None:
    t = TensorRef("X", "FP32", (1, 1), None, 0)
    e = wp.Execute(5, (wp.ExecuteRequest(1, (t,), (OutputRequest("Y"),)),))
    envelope = wp.encode_execute(e, [b"\x00" * 4])[0]
    header = msgspec.msgpack.decode(envelope[protocol.ENVELOPE_HEAD - 1 :])
    assert header == {
        "batch": 5,
        "requests": [{"id": 1, "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "frame": 0}],
                      "outputs": [{"name": "Y"}]}],
    }  # fmt: skip
    assert header == msgspec.msgpack.decode(protocol.encode(Command.W_EXECUTE, wp.execute_to_wire(e))[0][5:])
