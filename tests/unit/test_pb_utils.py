"""``triton_python_backend_utils`` without a server: the response sender's rules (Triton's texts), errors
and their codes, tensors and DLPack, names given as bytes, the logger, instance names, and the APIs zinfer
refuses by name."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    Unavailable,
    UnknownError,
    Unsupported,
    from_status,
)
from zinfer.modelconfig.instances import InstanceGroup
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.workers import triton_python_backend_utils as pb
from zinfer.workers.pb_errors import server_error, triton_error
from zinfer.workers.triton_model import instance_name

FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _sender(decoupled: bool) -> tuple[pb.InferenceResponseSender, list[tuple[Any, bool]], threading.Event]:
    sent: list[tuple[Any, bool]] = []
    flag = threading.Event()
    return pb.InferenceResponseSender(lambda r, f: sent.append((r, f)), flag, decoupled), sent, flag


def test_decoupled_sender_sends_many_then_final_and_refuses_more() -> None:
    sender, sent, flag = _sender(decoupled=True)
    one = pb.InferenceResponse([pb.Tensor("OUT", np.array([1]))])
    sender.send(one)
    sender.send(one)
    sender.send(flags=FINAL)  # the flag alone
    assert sent == [(one, False), (one, False), (None, True)]
    with pytest.raises(pb.TritonModelException, match="Response sender has been closed"):
        sender.send(one)
    assert not sender.is_cancelled()
    flag.set()
    assert sender.is_cancelled()


@pytest.mark.parametrize(
    "args, message",
    [
        ((None, 0), "Inference Response object must be provided when the response flags is set to zero"),
        ((None, 2), "Unsupported flag provided"),
        (("text", 0), "takes a pb_utils.InferenceResponse, got str"),
    ],
)
def test_sender_refuses_bad_sends(args: tuple[Any, int], message: str) -> None:
    sender, sent, _ = _sender(decoupled=True)
    with pytest.raises(pb.TritonModelException, match=message):
        sender.send(*args)
    assert sent == []


def test_sender_of_a_model_that_is_not_decoupled_sends_one_response() -> None:
    sender, sent, _ = _sender(decoupled=False)
    with pytest.raises(pb.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=FINAL)
    one = pb.InferenceResponse([])
    sender.send(one)
    with pytest.raises(pb.TritonModelException, match="cannot send more than one response"):
        sender.send(one)
    sender.send(flags=FINAL)
    assert sent == [(one, False), (None, True)]


def test_triton_error_codes_and_the_statuses_they_become() -> None:
    expected = {
        pb.TritonError.UNKNOWN: UnknownError,  # an InternalError that the front door answers as UNKNOWN
        pb.TritonError.INTERNAL: InternalError,
        pb.TritonError.NOT_FOUND: NotFound,
        pb.TritonError.INVALID_ARG: InvalidArgument,
        pb.TritonError.UNAVAILABLE: Unavailable,
        pb.TritonError.UNSUPPORTED: Unsupported,
        pb.TritonError.ALREADY_EXISTS: AlreadyExists,
        pb.TritonError.CANCELLED: Cancelled,
    }
    assert sorted(expected) == list(range(8))
    for code, cls in expected.items():
        error = pb.TritonError("why", code)
        assert error.code() == code and error.message() == "why"
        assert type(server_error(error)) is cls and str(server_error(error)) == "why"
    assert issubclass(UnknownError, InternalError)
    assert type(from_status(InternalError.status, UnknownError("w").wire_text())) is UnknownError
    assert pb.TritonError("default").code() == pb.TritonError.INTERNAL  # as Triton
    with pytest.raises(pb.TritonModelException, match="unknown error code 9"):
        pb.TritonError("bad", 9)
    # a BLS failure comes back with the code of its zinfer error
    assert triton_error(NotFound("no model")).code() == pb.TritonError.NOT_FOUND
    assert triton_error(RuntimeError("boom")).code() == pb.TritonError.INTERNAL


def test_read_only_inputs_export_through_dlpack() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    data.flags.writeable = False  # as an input over the client's memory is
    tensor = pb.Tensor("X", data)
    back = pb.Tensor.from_dlpack("Y", tensor.to_dlpack())  # a bare capsule, as torch's to_dlpack gives
    np.testing.assert_array_equal(back.as_numpy(), data)
    assert back.name() == "Y" and back.is_cpu()
    writable = np.ones(3, np.int64)
    shared = pb.Tensor.from_dlpack("Z", pb.Tensor("W", writable).to_dlpack())
    assert np.shares_memory(shared.as_numpy(), writable)  # zero-copy where the buffer allows it
    with pytest.raises(pb.TritonModelException, match="BYTES tensors cannot be exported"):
        pb.Tensor("S", np.array([b"a"], dtype=object)).to_dlpack()


def test_data_type_helpers() -> None:
    strings = np.array([b"ab", b"", b"xyz"], dtype=object)
    packed = pb.serialize_byte_tensor(strings)
    assert packed is not None and packed.tobytes() == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"
    assert pb.deserialize_bytes_tensor(packed).tolist() == [b"ab", b"", b"xyz"]
    assert pb.triton_to_numpy_type(11) is np.float32 and pb.numpy_to_triton_type(np.float32) == 11
    assert pb.numpy_to_triton_type(np.bytes_) == 13
    assert pb.triton_string_to_numpy("TYPE_INT64") is np.int64
    with pytest.raises(pb.TritonModelException, match="truncated"):
        pb.deserialize_bytes_tensor(b"\x05\x00")


def test_model_names_as_bytes_and_request_fields() -> None:
    r = pb.InferenceRequest(model_name=np.array([b"other"], dtype=np.bytes_)[0], inputs=[],
                            requested_output_names=[b"OUT"], parameters={"k": 1})  # fmt: skip
    assert r.model_name == "other" and r.model_name() == "other"
    assert r.requested_output_names() == ["OUT"] and json.loads(r.parameters()) == {"k": 1}
    with pytest.raises(pb.TritonModelException, match="model_name is not UTF-8"):
        pb.InferenceRequest(model_name=b"\xff")
    with pytest.raises(pb.TritonModelException, match="model_name must be a str"):
        pb.InferenceRequest(model_name=5)  # type: ignore[arg-type]
    with pytest.raises(
        pb.TritonModelException, match="values to have type bool/int/str, found type <class 'list'>"
    ):
        pb.InferenceRequest(parameters={"x": [1]})
    with pytest.raises(pb.TritonModelException, match="only a request given to execute has a response"):
        r.get_response_sender()
    assert not r.is_cancelled()


def test_response_parameters() -> None:
    r = pb.InferenceResponse([], parameters='{"a": "b"}')
    assert json.loads(r.parameters()) == {"a": "b"}
    with pytest.raises(pb.TritonModelException, match="parameters must be a dict or its JSON text"):
        pb.InferenceResponse([], parameters="{not json")
    with pytest.raises(pb.TritonModelException, match="must be a bool, a 64-bit int"):
        pb.InferenceResponse([], parameters={"big": 1 << 70})
    # Triton's checks and texts (its qa response_parameters_test matches on them)
    with pytest.raises(pb.TritonModelException, match=r"^Expect None or <class 'dict'>, got <class 'list'>$"):
        pb.InferenceResponse([], parameters=[])  # type: ignore[arg-type]
    with pytest.raises(pb.TritonModelException, match="keys to have type str, found type <class 'int'>"):
        pb.InferenceResponse([], parameters={1: "int key"})  # type: ignore[dict-item]
    for bad, kind in ((0.5, "float"), (None, "NoneType"), (["v"], "list")):
        with pytest.raises(pb.TritonModelException, match=f"bool/int/str, found type <class '{kind}'>"):
            pb.InferenceResponse([], parameters={"ok": 1, "bad": bad})
    with pytest.raises(pb.TritonModelException, match="output_tensors must be a list of pb_utils.Tensor"):
        pb.InferenceResponse([np.ones(1)])


def test_decoupled_policy_from_the_config() -> None:
    assert pb.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})
    assert not pb.using_decoupled_model_transaction_policy(json.dumps({"name": "m"}))


def test_logger_levels(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="triton_python_backend_utils")
    logger = pb.Logger
    logger.log("a")
    logger.log("b", logger.WARNING)
    logger.log("c", pb.LogLevel.ERROR)
    logger.log("d", pb.Logger.LogLevel.VERBOSE)
    logger.log_warn("e")
    logger.log_verbose("f")
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [(20, "a"), (30, "b"), (40, "c"), (10, "d"), (30, "e"), (10, "f")]
    with pytest.raises(pb.TritonModelException, match="unknown level 99"):
        logger.log("x", 99)


def test_instance_names_follow_triton() -> None:
    config = ModelConfig(
        name="m",
        instance_group=(
            InstanceGroup("m_0", "KIND_CPU", 2),
            InstanceGroup("custom", "KIND_GPU", 2, gpus=(0, 1)),
            InstanceGroup("m_2", "KIND_CPU", 1),
        ),
    )
    names = [instance_name(config, i) for i in range(7)]
    assert names == ["m_0_0", "m_0_1", "custom_0", "custom_1", "custom_0", "custom_1", "m_2_0"]


def test_refused_apis_say_so_by_name() -> None:
    r = pb.InferenceRequest()
    with pytest.raises(pb.TritonModelException, match="RELEASE_RESCHEDULE.*not supported"):
        r.set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    r.set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_ALL)
    memory = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_GPU, 0)
    assert memory.preferred_memory_type == pb.TRITONSERVER_MEMORY_GPU
