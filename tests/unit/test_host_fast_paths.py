"""The worker's plain batch path on the host skips its calls into the device (``device is CPU``: a lone
piece is its own batch, ``synchronize`` does nothing, a NumPy output is its own ``as_output``) and reads
input dtypes from its own table: the same arrays, results and errors as the calls gave, and any other
device (a GPU's) still gets every call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from tests.unit.test_batch_runner import CONFIG, SIG  # the same two-input add model
from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.workers.batch import BatchRequest, run_batch
from zinfer.workers.batch_io import check_output, input_array, slot_alloc
from zinfer.workers.device import CPU, CpuDevice
from zinfer.workers.kernels import AddKernel
from zinfer.workers.model import no_alloc
from zinfer.workers.regions import RegionCache


class CountingDevice(CpuDevice):
    """The host's behaviour, every call counted: a device that is not ``CPU`` itself."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def module_of(self, a: Any) -> Any:
        self._count("module_of")
        return super().module_of(a)

    def batch(self, pieces: Sequence[Any]) -> Any:
        self._count("batch")
        return super().batch(pieces)

    def as_output(self, value: Any) -> Any:
        self._count("as_output")
        return super().as_output(value)

    def synchronize(self) -> None:
        self._count("synchronize")


def _lone(frames: list[Any]) -> BatchRequest:
    refs = []
    for name, v in (("A", 1.0), ("B", 2.0)):
        frames.append(memoryview(np.full((1, 2), v, np.float32).tobytes()))
        refs.append(TensorRef(name, "FP32", (1, 2), frame=len(frames) - 1))
    return BatchRequest(7, tuple(refs), (OutputRequest("S"),))


def _sum(out: Any, frames: Sequence[Any]) -> Any:
    (res,) = out.results
    (ref,) = res.outputs
    return np.frombuffer(out.frames[ref.frame], np.float32).reshape(ref.shape)


@pytest.mark.parametrize("device", [CPU, CountingDevice()], ids=["host", "other"])
def test_a_lone_request_runs_the_same_on_the_host_and_on_any_other_device(device: Any) -> None:
    frames: list[Any] = []
    req = _lone(frames)
    model = AddKernel(CONFIG, None, device)
    out = run_batch(model, SIG, [req], frames, RegionCache(), device)
    assert np.array_equal(_sum(out, frames), np.full((1, 2), 3.0, np.float32))
    assert out.input_ns >= 0 and out.infer_ns > 0 and out.output_ns >= 0
    if device is not CPU:  # every call still made where the device is not the host's own
        assert device.calls == {"batch": 2, "module_of": 1, "as_output": 1, "synchronize": 2}


def test_the_host_batch_is_the_requests_own_read_only_arrays() -> None:
    seen: list[Mapping[str, Any]] = []

    class Keep:
        def execute(self, inputs: Mapping[str, Any], /) -> Any:
            seen.append(inputs)
            return {"S": inputs["A"] + inputs["B"]}

    frames: list[Any] = []
    out = run_batch(Keep(), SIG, [_lone(frames)], frames, RegionCache(), CPU)  # type: ignore[arg-type]
    (inputs,) = seen
    assert sorted(inputs) == ["A", "B"]
    for name, frame in zip(("A", "B"), frames, strict=True):
        arr = inputs[name]
        assert not arr.flags.writeable  # the client's memory
        assert arr.__array_interface__["data"][0] == np.frombuffer(frame, np.uint8).ctypes.data
    assert np.array_equal(_sum(out, frames), np.full((1, 2), 3.0, np.float32))


def test_outputs_that_are_not_numpy_arrays_still_go_through_as_output() -> None:
    arr = np.ones((1, 2), np.float32)
    assert check_output("S", arr, SIG, 1, CPU) is arr  # a NumPy array: itself, as np.asarray gives it
    listed = check_output("S", [np.array([1, 2], np.float32)], SIG, 1, CPU)  # anything else: NumPy's
    assert type(listed) is np.ndarray and listed.shape == (1, 2)

    class Sub(np.ndarray):
        pass

    sub = arr.view(Sub)
    assert type(check_output("S", sub, SIG, 1, CPU)) is np.ndarray  # a subclass: np.asarray's base array


@pytest.mark.parametrize("wire", sorted(dtypes.WIRE_TYPES - {dtypes.BYTES}))
def test_every_fixed_size_wire_type_reads_as_its_dtype(wire: str) -> None:
    dtype = dtypes.wire_to_numpy(wire)
    raw = memoryview(np.zeros((1, 3), dtype).tobytes())
    arr = input_array(TensorRef("X", wire, (1, 3), frame=0), [raw], RegionCache())
    assert arr.dtype == dtype and arr.shape == (1, 3) and not arr.flags.writeable


def test_an_unknown_wire_type_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="unknown data type 'FP8'"):
        input_array(TensorRef("X", "FP8", (1, 1), frame=0), [memoryview(b"\0")], RegionCache())


def test_slots_are_offered_only_to_a_request_that_has_them() -> None:
    plain = BatchRequest(1, (), (OutputRequest("S"),))
    assert slot_alloc(plain, RegionCache()) is no_alloc
    slotted = BatchRequest(1, (), (OutputRequest("S", ShmRef("r", 0, 8)),))
    assert slot_alloc(slotted, RegionCache()) is not no_alloc


def test_the_add_kernel_writes_into_an_offered_slot_and_keeps_its_input_order() -> None:
    config = parse_model_config(
        """
        name: "k"
        backend: "zinfer"
        input [ { name: "B" data_type: TYPE_FP32 dims: [ 2 ] },
                { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "S" data_type: TYPE_FP32 dims: [ 2 ] },
                 { name: "D" data_type: TYPE_FP32 dims: [ 2 ] } ]
        parameters { key: "kernel" value: { string_value: "add" } }
        """,
        source="test",
        model_name="k",
    )
    kernel = AddKernel(config, None, CPU)
    a, b = np.array([5.0, 7.0], np.float32), np.array([1.0, 2.0], np.float32)
    plain = kernel.execute({"A": a, "B": b})  # no slots: new arrays; the config's first input comes first
    assert np.array_equal(plain["S"], b + a) and np.array_equal(plain["D"], b - a)
    slot = np.zeros(2, np.float32)
    asked: list[str] = []

    def alloc(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        asked.append(name)
        return slot if name == "S" else None

    out = kernel.execute({"A": a, "B": b}, alloc)
    assert asked == ["S", "D"] and out["S"] is slot and np.array_equal(slot, b + a)
    assert np.array_equal(out["D"], b - a)
