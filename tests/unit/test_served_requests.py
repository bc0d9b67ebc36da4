"""The Triton request path's per-request objects, built in fewer calls: a served ``pb_utils`` request has the
same attributes as one ``_fill`` fills, the requests of a batch are attached to their senders in order, the
cancel flags of a batch come as ``flag`` gives them, ``open_inputs`` gives the same ``RequestInputs``, and
an output written into its slot is the piece's bytes, as the views it replaces wrote them."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

from zinfer.client.protocol import OutputRequest, ShmRef, TensorRef
from zinfer.client.shm import Segment
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers import triton_python_backend_utils as pb
from zinfer.workers.batch_io import BatchOutcome, BatchRequest, emit
from zinfer.workers.cancel_flags import CancelFlag, CancelFlags
from zinfer.workers.model import RequestInputs
from zinfer.workers.model_loop import Wake
from zinfer.workers.regions import RegionCache
from zinfer.workers.request_batch import open_inputs
from zinfer.workers.triton_model import _Senders, pb_request


def _filled(**kw: object) -> pb.InferenceRequest:
    request = pb.InferenceRequest.__new__(pb.InferenceRequest)
    args = dict(
        inputs=[],
        request_id="",
        outputs=[],
        model_name=pb.InferenceRequest().model_name,
        model_version=-1,
        correlation_id=0,
        flags=0,
        timeout=0,
        parameters={},
        cancelled=CancelFlag(),
    )
    args.update(kw)
    request._fill(**args)  # type: ignore[arg-type]
    return request


def test_a_served_request_has_every_attribute_fill_sets_and_no_other() -> None:
    t = pb.Tensor("X", np.arange(3, dtype=np.int32))
    flag = CancelFlag()
    served = pb.InferenceRequest._served([t], "r1", ("Y",), "m", 0, 0, {"k": 1}, flag)
    assert set(vars(served)) == set(vars(_filled()))
    assert served.inputs() == [t] and pb.get_input_tensor_by_name(served, "X") is t
    assert served.request_id() == "r1" and served.requested_output_names() == ["Y"]
    assert served.model_name == "m" and served.model_name() == "m" and served.model_version() == -1
    assert served.correlation_id() == 0 and served.flags() == 0 and served.timeout() == 0
    assert served.parameters() == '{"k": 1}' and served._cancelled is flag
    assert not served.trace().get_context()
    with pytest.raises(pb.TritonModelException):  # no sender until the worker attaches one
        served.get_response_sender()


def test_a_served_requests_lists_are_its_own_and_a_traceparent_is_its_trace() -> None:
    tensors = [pb.Tensor("X", np.zeros(2, np.float32))]
    params = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a": "b"}
    served = pb.InferenceRequest._served(tensors, "", ["Y"], "m", 0, 0, params)
    tensors.append(pb.Tensor("Z", np.zeros(2, np.float32)))
    assert [t.name() for t in served.inputs()] == ["X"]  # a copy of the list it was given
    assert served.parameters() == '{"a": "b"}' and params["a"] == "b" and "traceparent" in params
    assert served.trace().get_context() == params["traceparent"]
    assert not served.is_cancelled()  # a flag of its own when none is given


def test_pb_request_keeps_the_inputs_by_name_and_in_order() -> None:
    a, b = np.zeros(2, np.int32), np.ones(3, np.float32)
    flag = CancelFlag()
    r = RequestInputs("id", {"A": a, "B": b}, ("OUT",), None, {"p": True}, flag)
    request = pb_request(r, "m")
    assert [t.name() for t in request.inputs()] == ["A", "B"]
    assert pb.get_input_tensor_by_name(request, "B").as_numpy() is b  # type: ignore[union-attr]
    assert request.request_id() == "id" and request.requested_output_names() == ["OUT"]
    assert request.parameters() == '{"p": true}' and request._cancelled is flag


def test_attach_all_gives_each_request_its_slot_and_sender_in_order() -> None:
    flags = [CancelFlag(), CancelFlag()]
    inputs = [RequestInputs(f"r{i}", {"X": np.full(1, i, np.int32)}, ("Y",), None, None, flags[i])
              for i in range(2)]  # fmt: skip
    senders = _Senders(2, Wake())
    requests = senders.attach_all(inputs, "m")
    assert [r.request_id() for r in requests] == ["r0", "r1"] and [r._slot for r in requests] == [0, 1]
    assert len(senders._requests) == 2 and senders._requests[1]() is requests[1]
    sender = requests[1].get_response_sender()
    assert sender is requests[1].get_response_sender()  # made once
    response = pb.InferenceResponse([pb.Tensor("Y", np.zeros(1, np.int32))])
    sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert senders.sent() == [None, response] and senders.taken
    flags[1].set()
    assert sender.is_cancelled() and not requests[0].is_cancelled()
    del sender, response, requests
    gc.collect()
    assert senders.all_done()  # the first was let go of without a sender, the second sent its final flag


def test_flags_are_the_flags_flag_gives_and_a_cancel_sets_them() -> None:
    cancels = CancelFlags()
    cancels.begin_batch(3, [1, 2, 3])
    flags = cancels.flags([1, 3])
    assert flags[0] is cancels.flag(1) and flags[1] is cancels.flag(3)
    assert cancels.cancel(3, 3) and flags[1].is_set() and not flags[0].is_set()
    assert cancels.flags([]) == []


_CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def test_open_inputs_gives_each_request_its_named_fields() -> None:
    sig = Signature.of(parse_model_config(_CONFIG, source="test", model_name="m"))
    frames = [memoryview(np.arange(3, dtype=np.int32).tobytes()), memoryview(np.ones(3, np.int32).tobytes())]
    requests = [
        BatchRequest(
            i + 1, (TensorRef("X", "INT32", (1, 3), None, i),), (OutputRequest("Y"),), f"r{i}", None, {"p": i}
        )  # fmt: skip
        for i in range(2)
    ]
    cancels = CancelFlags()
    cancels.begin_batch(1, [1, 2])
    runnable, inputs = open_inputs(sig, requests, frames, RegionCache(), None, cancels, BatchOutcome())
    assert [o.req for o in runnable] == requests
    for i, one in enumerate(inputs):
        assert type(one) is RequestInputs
        assert one.request_id == f"r{i}" and one.outputs == ("Y",) and one.sequence is None
        assert one.parameters == {"p": i} and one.cancelled is cancels.flag(i + 1)
        assert one.inputs["X"].tolist() == ([[0, 1, 2]] if i == 0 else [[1, 1, 1]])
    _, plain = open_inputs(sig, requests, frames, RegionCache(), None, None, BatchOutcome())
    assert [one.cancelled for one in plain] == [None, None]


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.arange(6, dtype=np.float32).reshape(3, 2).T,  # not C-contiguous
        np.zeros((0, 4), np.float32),  # no bytes
        np.array(7, np.int64),  # no dimensions
        np.arange(3).astype(ml_dtypes.bfloat16),  # no buffer format
        np.array([True, False]),
    ],
)
def test_an_output_into_its_slot_is_the_pieces_bytes_at_the_slots_offset(arr: np.ndarray) -> None:
    seg = Segment.create(256)
    regions = RegionCache()
    try:
        frames: list[bytes | memoryview] = []
        ref = emit("Y", arr, ShmRef(seg.name, 64, 128), "FP32", regions, frames)
        assert frames == [] and ref.shape == arr.shape and ref.frame is None
        assert ref.shm == ShmRef(seg.name, 64, arr.nbytes)
        assert bytes(seg.buf[64 : 64 + arr.nbytes]) == np.ascontiguousarray(arr).tobytes()
        assert bytes(seg.buf[64 + arr.nbytes : 192]) == bytes(128 - arr.nbytes)  # nothing past its bytes
        big = emit("Y", np.zeros(40, np.int32), ShmRef(seg.name, 0, 128), "INT32", regions, frames)
        assert big.shm is None and big.frame == 0  # over the slot: inline, as before
    finally:
        regions.close()
        seg.close(unlink=True)


def test_senders_no_model_asked_for_make_no_lists_and_answer_as_before() -> None:
    inputs = [RequestInputs(f"r{i}", {"X": np.full(1, i, np.int32)}, ("Y",)) for i in range(2)]
    senders = _Senders(2, Wake())
    requests = senders.attach_all(inputs, "m")
    assert senders._lists is None and not senders.any_taken()  # the usual batch: nothing per request
    assert not senders.all_done()  # the model still holds both
    del requests
    gc.collect()
    assert senders.all_done() and senders.taken_done()
    assert senders.sent() == [None, None] and not senders.used
    assert [r.has_error() for r in senders.responses()] == [True, True]
