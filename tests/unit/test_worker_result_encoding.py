"""The worker sends its RESULT record as the header itself (msgspec writes the record's map, fields at their
defaults left out) instead of the map ``result_to_wire`` builds: both readers of a RESULT, the typed one
(``decode_result``) and the checked one (``decode`` then ``result_from_wire``), read back the same record."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from zinfer.client import protocol
from zinfer.client import worker_protocol as wp
from zinfer.client.errors import Status
from zinfer.client.protocol import Command, ShmRef, TensorRef

TEXT = st.characters(blacklist_categories=("Cs",))
names = st.text(TEXT, min_size=1, max_size=10)
u63 = st.integers(0, (1 << 63) - 1)
where = st.one_of(
    st.builds(ShmRef, names, u63, u63).map(lambda s: (s, None)),
    st.integers(0, 7).map(lambda f: (None, f)),
)
tensors = st.builds(
    lambda name, dtype, shape, w: TensorRef(name, dtype, tuple(shape), *w),
    names, st.sampled_from(["FP32", "INT32", "BYTES"]), st.lists(st.integers(0, 1 << 20), max_size=4), where,
)  # fmt: skip
scalars = st.booleans() | st.integers(-(1 << 40), 1 << 40) | st.text(TEXT, max_size=8)
parameters = st.dictionaries(names, scalars, max_size=3)
results = st.builds(
    wp.RequestResult, u63, st.sampled_from(list(Status)), st.text(TEXT, max_size=20),
    st.lists(tensors, max_size=3).map(tuple), st.none() | st.booleans(), parameters,
)  # fmt: skip
worker_results = st.one_of(
    st.builds(wp.WorkerResult, u63, st.lists(results, max_size=4).map(tuple), st.just(True)),
    st.builds(wp.WorkerResult, u63, st.lists(results, max_size=4).map(tuple), st.just(False),
              st.tuples(u63, u63, u63)),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(worker_results, st.lists(st.binary(max_size=40), max_size=3))
def test_a_result_record_sent_as_its_header_reads_back_the_same(
    result: wp.WorkerResult, frames: list[bytes]
) -> None:
    sent = [bytes(memoryview(f)) for f in protocol.encode(Command.W_RESULT, cast(Any, result), frames)]
    typed = wp.decode_result(sent)
    assert typed is not None and typed.record == result
    assert [bytes(memoryview(f)) for f in typed.frames] == frames
    checked = protocol.decode(sent)
    assert checked.command == Command.W_RESULT
    assert wp.result_from_wire(checked.header) == result


def test_a_result_record_header_is_the_map_less_its_defaults() -> None:
    ok = wp.RequestResult(3, outputs=(TensorRef("OUT", "FP32", (1, 2), None, 0),))
    failed = wp.RequestResult(4, Status.INVALID_ARGUMENT, "InvalidArgument: no")
    result = wp.WorkerResult(7, (ok, failed), timings=(1, 2, 3))
    header = protocol.decode(protocol.encode(Command.W_RESULT, cast(Any, result))).header
    built = wp.result_to_wire(result)
    assert header["results"][0] == {k: v for k, v in built["results"][0].items() if k != "status"}
    assert header["results"][1] == built["results"][1]
    assert header["t"] == built["t"] and header["batch"] == built["batch"]
