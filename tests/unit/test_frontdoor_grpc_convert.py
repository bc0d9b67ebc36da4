"""Triton's gRPC messages to the bridge's records and back (frontdoor/grpc_convert.py), without a server."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from tests.conftest import MODELS
from zinfer.client import dtypes
from zinfer.client.errors import InvalidArgument, NotFound
from zinfer.frontdoor import grpc_convert as convert
from zinfer.frontdoor.bridge_records import (
    BatchStat,
    Duration,
    InferReply,
    ModelMetadata,
    ModelStatistics,
    Tensor,
    TensorSpec,
)
from zinfer.frontdoor.door_client import wire_bytes, with_wire
from zinfer.frontdoor.sysshm import SystemShm
from zinfer.modelconfig.model_config import load_model_config


def _request(model: str = "m") -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(model_name=model, model_version="2", id="rid")


def test_raw_inputs_of_every_kind() -> None:
    r = _request()
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    i8 = np.array([-1, 2], np.int8)
    bf = np.array([1.5, -0.5], ml_dtypes.bfloat16)
    text = np.array([b"a", b"", b"xyz"], np.object_)
    for name, arr, dt in (("F", f32, "FP32"), ("I", i8, "INT8"), ("B", bf, "BF16"), ("T", text, "BYTES")):
        r.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
        r.raw_input_contents.append(dtypes.serialize_bytes(arr) if dt == "BYTES" else arr.tobytes())
    call = convert.infer_call(r, None)
    assert (call.model, call.version, call.request_id) == ("m", "2", "rid")
    got = {t.name: t for t in call.inputs}
    np.testing.assert_array_equal(got["F"].data, f32)
    np.testing.assert_array_equal(got["I"].data, i8)
    assert got["B"].data.dtype == ml_dtypes.bfloat16 and got["B"].data.tobytes() == bf.tobytes()
    assert got["T"].data.tolist() == [b"a", b"", b"xyz"]


def test_bytes_keep_their_wire_form() -> None:
    """A BYTES input read from raw_input_contents goes on as the bytes it came in (not decoded and encoded
    again); a response's BYTES output read from the broker's frame likewise; a view encodes anew."""
    r = _request()
    text = np.array([b"a", b"", b"xyz"], np.object_)
    wire = dtypes.serialize_bytes(text)
    r.inputs.add(name="T", datatype="BYTES", shape=[3])
    r.raw_input_contents.append(wire)
    data = convert.infer_call(r, None).inputs[0].data
    assert data.tolist() == [b"a", b"", b"xyz"] and wire_bytes(data) == wire
    assert wire_bytes(data[:2]) == dtypes.serialize_bytes(text[:2])  # a view: its own items encoded
    out = Tensor("Y", "BYTES", (3,), with_wire(dtypes.deserialize_bytes(wire, (3,)), wire))
    response = convert.infer_response(InferReply("m", "1", "", (out,)))
    assert response.raw_output_contents[0] == wire
    changed = Tensor("Y", "BYTES", (1,), np.array([b"new"], np.object_))  # a plain array: encoded
    response = convert.infer_response(InferReply("m", "1", "", (changed,)))
    assert response.raw_output_contents[0] == dtypes.serialize_bytes(changed.data)


def test_typed_contents() -> None:
    r = _request()
    t = r.inputs.add(name="X", datatype="INT32", shape=[2])
    t.contents.int_contents.extend([7, -8])
    s = r.inputs.add(name="S", datatype="BYTES", shape=[1])
    s.contents.bytes_contents.append(b"hi")
    call = convert.infer_call(r, None)
    assert call.inputs[0].data.tolist() == [7, -8] and call.inputs[0].data.dtype == np.int32
    assert call.inputs[1].data.tolist() == [b"hi"]


def test_request_parameters() -> None:
    r = _request()
    r.parameters["priority"].int64_param = 2
    r.parameters["timeout"].int64_param = 5000
    r.parameters["sequence_id"].string_param = "abc"
    r.parameters["sequence_start"].bool_param = True
    r.parameters["sequence_end"].bool_param = False
    r.parameters["custom"].string_param = "kept"
    call = convert.infer_call(r, None)
    assert (call.priority, call.timeout_us, call.sequence_id, call.sequence_start, call.sequence_end) == (
        2, 5000, "abc", True, False,
    )  # fmt: skip
    assert call.parameters["custom"] == "kept"
    r.parameters["sequence_id"].uint64_param = (1 << 64) - 1
    assert convert.infer_call(r, None).sequence_id == (1 << 64) - 1


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda r: (r.inputs.add(name="X", datatype="FP32", shape=[2]), r.raw_input_contents.append(b"1234")),
         "input byte size mismatch for input 'X' for model 'm'. Expected 8, got 4"),
        (lambda r: r.inputs.add(name="X", datatype="FP32", shape=[1]), "has no data"),
        (lambda r: r.raw_input_contents.append(b"1234"), "1 raw_input_contents for 0 inputs"),
        (lambda r: r.inputs.add(name="X", datatype="COMPLEX", shape=[1]), "unknown data type"),
        (lambda r: r.inputs.add(name="X", datatype="FP32", shape=[-2]), "invalid shape"),
        (lambda r: r.inputs.add(name="X", datatype="FP32", shape=[1 << 30, 1 << 30]), "invalid shape"),
        (lambda r: r.parameters["priority"].CopyFrom(service_pb2.InferParameter(string_param="high")),
         "'priority' must be an integer"),
        (lambda r: r.parameters["sequence_id"].CopyFrom(service_pb2.InferParameter(double_param=1.0)),
         "'sequence_id' must be an integer or a string"),
        (lambda r: r.parameters["sequence_start"].CopyFrom(service_pb2.InferParameter(int64_param=1)),
         "'sequence_start' must be a bool"),
        (lambda r: r.inputs.add(name="X", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0),
         "must come in raw_input_contents"),
        (lambda r: r.inputs.add(name="X", datatype="FP32", shape=[2]).contents.fp32_contents.append(1.0),
         "expected 2, got 1"),
        # Triton's text (tritonclient's grpc_explicit_int_content_client.py matches on it)
        (lambda r: (r.inputs.add(name="X", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2]),
                    r.raw_input_contents.append(bytes(8))),
         "contents field must not be specified when using raw_input_contents for 'X' for model 'm'"),
    ],
)  # fmt: skip
def test_malformed_requests_are_invalid(build: object, message: str) -> None:
    r = _request()
    build(r)  # type: ignore[operator]
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(".", r"\.")):
        convert.infer_call(r, None)


def test_the_same_input_twice_and_an_unnamed_model_are_refused() -> None:
    r = _request()
    for _ in range(2):
        r.inputs.add(name="X", datatype="INT8", shape=[1]).contents.int_contents.append(1)
    with pytest.raises(InvalidArgument, match="more than once"):
        convert.infer_call(r, None)
    with pytest.raises(InvalidArgument, match="names no model"):
        convert.infer_call(_request(""), None)


def test_classification_counts_are_taken_and_bad_ones_refused() -> None:
    r = _request()
    r.outputs.add(name="Y").parameters["classification"].int64_param = 3
    r.outputs.add(name="Z").parameters["classification"].int64_param = 0  # 0: the tensor itself, as Triton
    assert convert.infer_call(r, None).class_counts == {"Y": 3}
    r.outputs.add(name="W").parameters["classification"].string_param = "3"
    with pytest.raises(InvalidArgument, match="invalid value type for 'classification' parameter"):
        convert.infer_call(r, None)
    r = _request()
    out = r.outputs.add(name="Y")
    out.parameters["classification"].int64_param = 1
    out.parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(InvalidArgument, match="classification cannot be written to shared memory"):
        convert.infer_call(r, None)


def test_shared_memory_inputs_and_outputs(tmp_path: Path) -> None:
    seg = tmp_path / "shm" / "seg"
    seg.parent.mkdir()
    a = np.arange(4, dtype=np.float32)
    seg.write_bytes(a.tobytes() + bytes(16))
    registry = SystemShm(tmp_path / "reg", seg.parent)
    try:
        registry.register("R", "/seg", 0, 32, uid=os.getuid())
        r = _request()
        t = r.inputs.add(name="X", datatype="FP32", shape=[4])
        t.parameters["shared_memory_region"].string_param = "R"
        t.parameters["shared_memory_byte_size"].int64_param = 16
        o = r.outputs.add(name="Y")
        o.parameters["shared_memory_region"].string_param = "R"
        o.parameters["shared_memory_offset"].int64_param = 16
        o.parameters["shared_memory_byte_size"].int64_param = 16
        arena: list[np.ndarray] = []

        def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:  # type: ignore[type-arg]
            arena.append(np.zeros(shape, dtype))
            return arena[-1]

        call = convert.infer_call(r, registry.caller(os.getuid()), alloc)
        assert call.inputs[0].data is arena[0]  # read straight into the bridge's array
        np.testing.assert_array_equal(call.inputs[0].data, a)
        regions = convert.output_regions(r)
        assert regions == {"Y": ("R", 16, 16)}
        reply = InferReply("m", "1", "rid", (Tensor("Y", "FP32", (4,), a * 2),))
        response = convert.infer_response(reply, regions, registry.caller(os.getuid()))
        assert list(response.raw_output_contents) == [b""]  # one entry per output, as Triton's
        assert response.outputs[0].parameters["shared_memory_byte_size"].int64_param == 16
        assert np.frombuffer(seg.read_bytes()[16:], np.float32).tolist() == [0.0, 2.0, 4.0, 6.0]
        t.parameters["shared_memory_region"].string_param = "missing"
        with pytest.raises(NotFound, match="Unable to find system shared memory region: 'missing'"):
            convert.infer_call(r, registry.caller(os.getuid()), alloc)
        t.parameters["shared_memory_region"].string_param = "R"
        t.parameters["shared_memory_byte_size"].int64_param = 12
        with pytest.raises(InvalidArgument, match="Expected 16, got 12"):
            convert.infer_call(r, registry.caller(os.getuid()), alloc)
    finally:
        registry.close()


def test_a_shared_memory_output_keeps_the_raw_contents_aligned_with_the_outputs(tmp_path: Path) -> None:
    """Triton puts an (empty) raw_output_contents entry for every output, shared-memory ones included, and
    clients index them by output: failed before (the inline output after a shared-memory one was read from
    the wrong index, and perf_analyzer crashed on such responses)."""
    import tritonclient.grpc as grpcclient

    seg = tmp_path / "shm" / "seg"
    seg.parent.mkdir()
    seg.write_bytes(bytes(32))
    registry = SystemShm(tmp_path / "reg", seg.parent)
    try:
        registry.register("R", "/seg", 0, 32, uid=os.getuid())
        first, second = np.arange(4, dtype=np.float32), np.array([7, 8, 9], np.int32)
        reply = InferReply(
            "m", "1", "rid", (Tensor("A", "FP32", (4,), first), Tensor("B", "INT32", (3,), second))
        )
        response = convert.infer_response(reply, {"A": ("R", 0, 16)}, registry.caller(os.getuid()))
        assert list(response.raw_output_contents) == [b"", second.tobytes()]
        result = grpcclient.InferResult(response)
        np.testing.assert_array_equal(result.as_numpy("B"), second)
        assert np.frombuffer(seg.read_bytes()[:16], np.float32).tolist() == first.tolist()
    finally:
        registry.close()


def test_responses_carry_raw_outputs() -> None:
    reply = InferReply("m", "3", "rid", (
        Tensor("A", "FP32", (2,), np.array([1.0, 2.0], np.float32)),
        Tensor("S", "BYTES", (2,), np.array([b"x", b"yz"], np.object_)),
    ))  # fmt: skip
    response = convert.infer_response(reply)
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "rid")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("A", "FP32", [2]),
        ("S", "BYTES", [2]),
    ]
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1.0, 2.0]
    assert dtypes.deserialize_bytes(response.raw_output_contents[1], (2,)).tolist() == [b"x", b"yz"]


def test_config_becomes_tritons_model_config() -> None:
    for name in ("add", "running_sum", "token_stream"):
        config = load_model_config(MODELS / name / "config.pbtxt", name)
        message = convert.config_message(config.to_dict()).config
        assert isinstance(message, model_config_pb2.ModelConfig)
        assert message.name == name and message.max_batch_size == config.max_batch_size
        assert [i.name for i in message.input] == [i.name for i in config.input]
        assert json_format.MessageToDict(message)  # a whole message, serialisable
    running = convert.config_message(load_model_config(MODELS / "running_sum" / "config.pbtxt", "running_sum")
                                     .to_dict()).config  # fmt: skip
    assert running.sequence_batching.max_sequence_idle_microseconds == 5000000
    assert [c.name for c in running.sequence_batching.control_input] == ["START", "CORRID"]


def test_metadata_statistics_and_index() -> None:
    specs = ((TensorSpec("X", "FP32", (-1, 4)),), (TensorSpec("Y", "INT8", (-1,)),))
    meta = convert.metadata_message(ModelMetadata("m", ("1", "2"), "zinfer", 8, *specs))
    assert list(meta.versions) == ["1", "2"] and list(meta.inputs[0].shape) == [-1, 4]
    stats = convert.statistics_message((ModelStatistics(
        "m", "1", 123, 10, 4, {"success": Duration(4, 1000), "queue": Duration(4, 50)}, (BatchStat(2, 3),),
    ),))  # fmt: skip
    s = stats.model_stats[0]
    assert (s.last_inference, s.inference_count, s.execution_count) == (123, 10, 4)
    assert (s.inference_stats.success.count, s.inference_stats.queue.ns) == (4, 50)
    assert (s.batch_stats[0].batch_size, s.batch_stats[0].compute_infer.count) == (2, 3)
