"""The worker's batch runner on inline frames: gather, run, scatter, and every way a model can fail."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import InternalError
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.client.worker_protocol import (
    ExecuteRequest,
    SequenceFlags,
    request_result_to_wire,
    sequence_to_wire,
)
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchRequest, run_batch
from zinfer.workers.batch_io import BatchOutcome, batch_request, error_result
from zinfer.workers.kernels import AddKernel
from zinfer.workers.regions import RegionCache

CONFIG = parse_model_config(
    """
    name: "m"
    backend: "zinfer"
    max_batch_size: 8
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "S" data_type: TYPE_FP32 dims: [ 2 ] } ]
    parameters { key: "kernel" value: { string_value: "add" } }
    """,
    source="test",
    model_name="m",
)
SIG = Signature.of(CONFIG)


def _request(rid: int, rows: int, frames: list[Any], value: float) -> BatchRequest:
    refs = []
    for name in ("A", "B"):
        frames.append(np.full((rows, 2), value, np.float32).tobytes())
        refs.append(TensorRef(name, "FP32", (rows, 2), frame=len(frames) - 1))
    return BatchRequest(rid, tuple(refs), (OutputRequest("S"),))


class Fixed:
    """A model that returns whatever it was built with."""

    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self.result, self.error = result, error

    def execute(self, inputs: Mapping[str, Any], /) -> Any:
        if self.error is not None:
            raise self.error
        return self.result

    def finalize(self) -> None:
        pass


def _outputs(outcome: Any, rid: int) -> np.ndarray:
    res = next(request_result_to_wire(r) for r in outcome.results if r.id == rid)
    assert res["status"] == 0, res
    t = res["outputs"][0]
    return np.frombuffer(outcome.frames[t["frame"]], np.float32).reshape(t["shape"])


def test_batch_is_split_back_per_request() -> None:
    frames: list[Any] = []
    reqs = [_request(1, 1, frames, 1.0), _request(2, 3, frames, 2.0), _request(3, 2, frames, 3.0)]
    out = run_batch(AddKernel(CONFIG, None), SIG, reqs, frames, RegionCache())  # type: ignore[arg-type]
    np.testing.assert_array_equal(_outputs(out, 1), np.full((1, 2), 2.0))
    np.testing.assert_array_equal(_outputs(out, 2), np.full((3, 2), 4.0))
    np.testing.assert_array_equal(_outputs(out, 3), np.full((2, 2), 6.0))
    assert out.infer_ns > 0


@pytest.mark.parametrize(
    "model, message",
    [
        (Fixed({"S": np.zeros((5, 2), np.float32)}), "batch size 5, the inputs had 4"),
        (Fixed({"S": np.zeros((4, 2), np.float64)}), "dtype float64"),
        (Fixed({"S": np.zeros((4, 3), np.float32)}), "dims [2]"),
        (Fixed({}), "no output named 'S'"),
        (Fixed([1, 2]), "expected a dict"),
        (Fixed(error=ZeroDivisionError("boom")), "model raised ZeroDivisionError: boom"),
    ],
)
def test_model_failures_fail_the_batch_with_a_clear_error(model: Any, message: str) -> None:
    frames: list[Any] = []
    reqs = [_request(1, 1, frames, 1.0), _request(2, 3, frames, 1.0)]
    out = run_batch(model, SIG, reqs, frames, RegionCache())
    assert [r.id for r in out.results] == [1, 2]
    for r in out.results:
        assert r.status != 0
        assert message in r.error
    assert out.frames == []


def test_bad_region_fails_only_its_request() -> None:
    frames: list[Any] = []
    good = _request(1, 1, frames, 1.0)
    bad = BatchRequest(
        2,
        (
            TensorRef("A", "FP32", (1, 2), shm=ShmRef("zinfer-c1-00000000000000aa", 0, 8)),
            TensorRef("B", "FP32", (1, 2), shm=ShmRef("zinfer-c1-00000000000000aa", 8, 8)),
        ),
        (OutputRequest("S"),),
    )
    out = run_batch(AddKernel(CONFIG, None), SIG, [good, bad], frames, RegionCache())  # type: ignore[arg-type]
    np.testing.assert_array_equal(_outputs(out, 1), np.full((1, 2), 2.0))
    failed = next(r for r in out.results if r.id == 2)
    assert failed.status != 0 and "not registered" in failed.error


def test_kernel_writes_straight_into_the_output_slot() -> None:
    seg = Segment.create(4096)
    regions = RegionCache()
    try:
        a = np.frombuffer(seg.buf, np.float32, count=2, offset=0)
        a[:] = [1.5, 2.5]
        refs = (
            TensorRef("A", "FP32", (1, 2), shm=ShmRef(seg.name, 0, 8)),
            TensorRef("B", "FP32", (1, 2), shm=ShmRef(seg.name, 0, 8)),
        )
        req = BatchRequest(1, refs, (OutputRequest("S", ShmRef(seg.name, 64, 8)),))
        out = run_batch(AddKernel(CONFIG, None), SIG, [req], [], regions)  # type: ignore[arg-type]
        assert out.results[0].outputs[0].shm == (seg.name, 64, 8)
        np.testing.assert_array_equal(np.frombuffer(seg.buf, np.float32, count=2, offset=64), [3.0, 5.0])
        del a
    finally:
        regions.close()
        seg.close()


def test_reshape_is_applied_both_ways() -> None:
    """The model sees the config's reshape; the client gets dims back."""
    cfg = parse_model_config(
        """
        name: "r"
        backend: "zinfer"
        max_batch_size: 4
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 2, 3 ] } } ]
        output [ { name: "S" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 2, 3 ] } } ]
        """,
        source="test",
        model_name="r",
    )
    seen: list[tuple[int, ...]] = []

    class Shapes:
        def execute(self, inputs: Mapping[str, Any], /) -> Any:
            seen.append(inputs["A"].shape)
            return {"S": inputs["A"] * 2}

        def finalize(self) -> None:
            pass

    frames: list[Any] = [np.arange(12, dtype=np.float32).tobytes()]
    req = BatchRequest(1, (TensorRef("A", "FP32", (2, 6), frame=0),), (OutputRequest("S"),))
    out = run_batch(Shapes(), Signature.of(cfg), [req], frames, RegionCache())
    assert seen == [(2, 2, 3)]
    np.testing.assert_array_equal(_outputs(out, 1), np.arange(12, dtype=np.float32).reshape(2, 6) * 2)


def test_reshape_on_outputs_only_is_applied_every_batch() -> None:
    """Whether a model's specs reshape is known per spec mapping (inputs and outputs apart) and kept: an
    output-only reshape is applied on every batch, a lone request's and a batch of two alike."""
    cfg = parse_model_config(
        """
        name: "ro"
        backend: "zinfer"
        max_batch_size: 4
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 6 ] } ]
        output [ { name: "S" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 2, 3 ] } } ]
        """,
        source="test",
        model_name="ro",
    )
    seen: list[tuple[int, ...]] = []

    class Shapes:
        def execute(self, inputs: Mapping[str, Any], /) -> Any:
            seen.append(inputs["A"].shape)
            return {"S": (inputs["A"] * 2).reshape(-1, 2, 3)}

        def finalize(self) -> None:
            pass

    sig = Signature.of(cfg)
    frames: list[Any] = [np.arange(6, dtype=np.float32).tobytes(), np.ones(6, np.float32).tobytes()]
    lone = BatchRequest(1, (TensorRef("A", "FP32", (1, 6), frame=0),), (OutputRequest("S"),))
    other = BatchRequest(2, (TensorRef("A", "FP32", (1, 6), frame=1),), (OutputRequest("S"),))
    for requests in ([lone], [lone], [lone, other]):
        out = run_batch(Shapes(), sig, requests, frames, RegionCache())
        np.testing.assert_array_equal(_outputs(out, 1), np.arange(6, dtype=np.float32).reshape(1, 6) * 2)
    np.testing.assert_array_equal(_outputs(out, 2), np.full((1, 6), 2.0, np.float32))
    assert seen == [(1, 6), (1, 6), (2, 6)]  # the inputs as they came: no reshape on them


def test_a_mapping_that_is_not_a_dict_missing_an_output_fails_the_batch() -> None:
    class Outputs(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Any:
            return iter(())

        def __len__(self) -> int:
            return 0

    frames: list[Any] = []
    out = run_batch(Fixed(Outputs()), SIG, [_request(1, 1, frames, 1.0)], frames, RegionCache())
    res = request_result_to_wire(out.results[0])
    assert res["status"] != 0 and "no output named 'S'" in res["error"]


def test_an_outcome_starts_empty_and_owns_its_lists() -> None:
    """BatchOutcome is a plain class (a compiled dataclass's ``__init__`` is interpreted): each outcome starts
    with lists of its own, zero timings, and takes what it is given."""
    a, b = BatchOutcome(), BatchOutcome()
    assert (a.results, a.frames, a.input_ns, a.infer_ns, a.output_ns) == ([], [], 0, 0, 0)
    a.results.append(error_result(1, InternalError("x")))
    a.frames.append(b"f")
    assert b.results == [] and b.frames == []
    frames: list[Any] = [b"y"]
    c = BatchOutcome(frames=frames, input_ns=1, infer_ns=2, output_ns=3)
    assert c.frames is frames and (c.input_ns, c.infer_ns, c.output_ns) == (1, 2, 3)
    assert "input_ns=1" in repr(c) and repr(c).startswith("BatchOutcome(")


def test_a_request_from_the_broker_keeps_every_field() -> None:
    t = TensorRef("A", "FP32", (1, 2), frame=0)
    seq = SequenceFlags(7, start=True)
    plain = ExecuteRequest(3, (t,), (OutputRequest("S"),), "rid", None, {"p": 1})
    r = batch_request(plain)
    assert type(r) is BatchRequest and r == BatchRequest.from_broker(plain)
    assert r == BatchRequest(3, (t,), (OutputRequest("S"),), "rid", None, {"p": 1})
    r = batch_request(ExecuteRequest(4, (t,), (), sequence=seq))
    assert r.sequence == sequence_to_wire(seq) and r.parameters == {}
