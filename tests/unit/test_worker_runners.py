"""The worker's runner per model kind (chosen once at load) and the Reply guard that answers every EXECUTE."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zinfer.client.errors import InvalidArgument, Status
from zinfer.client.protocol import Frame, OutputRequest, TensorRef
from zinfer.client.worker_protocol import RequestResult, WorkerResult
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers import triton_python_backend_utils as pb
from zinfer.workers.batch import BatchRequest
from zinfer.workers.batch_io import BatchOutcome, ok_result
from zinfer.workers.device import CPU
from zinfer.workers.kernels import AddKernel
from zinfer.workers.model import RequestInputs, RequestModel
from zinfer.workers.model import RequestResult as ModelResult
from zinfer.workers.regions import RegionCache
from zinfer.workers.runners import (
    DenseRunner,
    Reply,
    RequestRunner,
    SideRequestRunner,
    StreamRunner,
    runner_for,
)
from zinfer.workers.runtime import WorkerRuntime
from zinfer.workers.side_work import SideWork
from zinfer.workers.triton_model import TritonModel

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


def _requests(n: int) -> tuple[list[BatchRequest], list[Any]]:
    frames: list[Any] = []
    reqs = []
    for rid in range(n):
        refs = []
        for name in ("A", "B"):
            frames.append(np.full((1, 2), rid, np.float32).tobytes())
            refs.append(TensorRef(name, "FP32", (1, 2), frame=len(frames) - 1))
        reqs.append(BatchRequest(rid, tuple(refs), (OutputRequest("S"),)))
    return reqs, frames


class Echo(RequestModel):
    def execute_requests(self, requests: Sequence[RequestInputs], /) -> Sequence[ModelResult]:
        return [{"S": np.asarray(r.inputs["A"]) + np.asarray(r.inputs["B"])} for r in requests]


class Sent:
    def __init__(self) -> None:
        self.results: list[WorkerResult] = []

    def __call__(self, result: WorkerResult, frames: list[Frame]) -> None:
        self.results.append(result)


def _runner(model: Any, sig: Signature = SIG) -> object:
    runtime = WorkerRuntime()
    return runner_for(model, sig, RegionCache(), CPU, None, runtime, SideWork(runtime))


def test_each_model_kind_gets_its_runner_once() -> None:
    assert isinstance(_runner(AddKernel(CONFIG, None)), DenseRunner)
    assert isinstance(_runner(Echo()), RequestRunner)
    decoupled = Signature.of(parse_model_config(
        'name: "d" backend: "python" model_transaction_policy { decoupled: true }'
        ' input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]'
        ' output [ { name: "S" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        source="test", model_name="d",
    ))  # fmt: skip
    assert isinstance(_runner(AddKernel(CONFIG, None), decoupled), StreamRunner)


@pytest.mark.parametrize("model", [AddKernel(CONFIG, None), Echo()])
def test_the_runner_answers_every_request(model: Any) -> None:
    reqs, frames = _requests(3)
    runner = _runner(model)
    sent = Sent()
    with Reply(7, reqs, sent) as reply:
        reply.outcome = runner.run(7, False, reqs, frames, reply)  # type: ignore[attr-defined]
    (result,) = sent.results
    assert result.batch == 7 and [r.id for r in result.results] == [0, 1, 2]
    assert all(r.status == Status.OK for r in result.results)


def test_a_runner_that_raises_still_answers_each_request_once() -> None:
    reqs, _ = _requests(3)
    sent = Sent()
    with Reply(9, reqs, sent) as reply:
        out = BatchOutcome()
        out.results.append(ok_result(1, []))  # answered before the failure: kept as it is
        reply.outcome = out
        raise RuntimeError("the device went away")
    (result,) = sent.results
    by_id = {r.id: r for r in result.results}
    assert sorted(by_id) == [0, 1, 2] and len(result.results) == 3
    assert by_id[1].status == Status.OK
    assert by_id[0].status == by_id[2].status == Status.INTERNAL
    assert "RuntimeError: the device went away" in by_id[0].error


def test_a_batch_handed_on_is_not_answered_now() -> None:
    reqs, _ = _requests(1)
    sent = Sent()
    with Reply(3, reqs, sent) as reply:
        reply.partial(RequestResult(0, final=False), [])
        reply.outcome = None  # runs on beside the next batches (an async decoupled execute)
    assert [r.partial for r in sent.results] == [True]


def test_an_exit_that_is_not_an_error_is_answered_and_goes_on() -> None:
    reqs, _ = _requests(2)
    sent = Sent()
    with pytest.raises(KeyboardInterrupt), Reply(4, reqs, sent):
        raise KeyboardInterrupt
    assert [r.status for r in sent.results[0].results] == [Status.INTERNAL, Status.INTERNAL]


def test_a_server_error_that_escapes_the_runner_reaches_its_requests_as_it_is() -> None:
    reqs, _ = _requests(1)
    sent = Sent()
    with Reply(5, reqs, sent):
        raise InvalidArgument("shared-memory region is no longer registered")
    (entry,) = sent.results[0].results
    assert entry.status == Status.INVALID_ARGUMENT and "no longer registered" in entry.error


class AsyncAdd:
    """A Triton-style model whose ``async def execute`` returns its responses (not decoupled): each batch
    waits until ``go`` is set; A < 0 raises."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.running = 0
        self.most = 0

    async def execute(self, requests: list[Any]) -> list[Any]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            while not self.go.is_set():
                await asyncio.sleep(0.005)
            out = []
            for r in requests:
                a = pb.get_input_tensor_by_name(r, "A").as_numpy()
                if a.min() < 0:
                    raise ValueError("A cannot be negative")
                b = pb.get_input_tensor_by_name(r, "B").as_numpy()
                out.append(pb.InferenceResponse([pb.Tensor("S", a + b)]))
            return out
        finally:
            self.running -= 1


def test_async_batches_that_return_responses_run_side_by_side_and_each_is_answered_alone() -> None:
    runtime = WorkerRuntime()
    side = SideWork(runtime)
    model = AsyncAdd()
    triton = TritonModel(model, Path("/nonexistent/m/1"), CONFIG, threads=runtime.threads)
    runner = runner_for(triton, SIG, RegionCache(), CPU, None, runtime, side)
    assert isinstance(runner, SideRequestRunner)
    reqs, frames = _requests(3)
    frames[4] = np.full((1, 2), -1, np.float32).tobytes()  # request 2's A: the model raises for it
    sent = Sent()
    try:
        for batch, req in enumerate(reqs, start=1):  # three EXECUTEs, one request each
            with Reply(batch, [req], sent) as reply:
                reply.outcome = runner.run(batch, False, [req], frames, reply)
        assert sent.results == [] and sorted(side.runs) == [1, 2, 3]  # all three run on, none answered
        deadline = time.monotonic() + 10
        while model.most < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert model.most == 3  # their coroutines run at once
        model.go.set()
        while len(sent.results) < 3 and time.monotonic() < deadline:
            side.tend(lambda *_: None, sent)
            time.sleep(0.005)
    finally:
        runtime.close()
    by_batch = {r.batch: r.results for r in sent.results}
    assert sorted(by_batch) == [1, 2, 3] and not side.runs
    assert [[e.id for e in by_batch[b]] for b in (1, 2, 3)] == [[0], [1], [2]]  # one RESULT per EXECUTE
    assert by_batch[1][0].status == by_batch[2][0].status == Status.OK
    (failed,) = by_batch[3]
    assert failed.status == Status.INTERNAL and "ValueError: A cannot be negative" in failed.error


class UntilCancelled:
    async def execute(self, requests: list[Any]) -> list[Any]:
        while not all(r.is_cancelled() for r in requests):
            await asyncio.sleep(0.005)
        error = pb.TritonError("cancelled", pb.TritonError.CANCELLED)
        return [pb.InferenceResponse(error=error) for _ in requests]


def test_a_cancel_reaches_an_async_batch_running_beside_the_next() -> None:
    runtime = WorkerRuntime()
    side = SideWork(runtime)
    triton = TritonModel(UntilCancelled(), Path("/nonexistent/m/1"), CONFIG, threads=runtime.threads)
    runner = runner_for(triton, SIG, RegionCache(), CPU, None, runtime, side)
    reqs, frames = _requests(2)
    sent = Sent()
    try:
        for batch, req in enumerate(reqs, start=1):  # as the worker runs each EXECUTE
            runtime.cancels.begin_batch(batch, [req.id])
            with Reply(batch, [req], sent) as reply:
                reply.outcome = runner.run(batch, False, [req], frames, reply)
        assert runtime.cancels.cancel(1, 0)  # the first batch's request, while the second has begun
        deadline = time.monotonic() + 10
        while not sent.results and time.monotonic() < deadline:
            side.tend(lambda *_: None, sent)
            time.sleep(0.005)
        assert [r.batch for r in sent.results] == [1] and sorted(side.runs) == [2]
        assert runtime.cancels.cancel(2, 1)
        while len(sent.results) < 2 and time.monotonic() < deadline:
            side.tend(lambda *_: None, sent)
            time.sleep(0.005)
    finally:
        runtime.close()
    answers = [(r.batch, r.results[0].status) for r in sent.results]
    assert answers == [(1, Status.CANCELLED), (2, Status.CANCELLED)]


class SendsLater:
    """Not decoupled, answers through its senders after ``execute`` returned None (Triton allows it)."""

    async def execute(self, requests: list[Any]) -> None:
        a_of = [pb.get_input_tensor_by_name(r, "A").as_numpy() for r in requests]
        senders = [(r.get_response_sender(), a) for r, a in zip(requests, a_of, strict=True)]

        async def later() -> None:
            await asyncio.sleep(0.05)
            for sender, a in senders:
                sender.send(pb.InferenceResponse([pb.Tensor("S", a * 2)]),
                            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # fmt: skip

        self.task = asyncio.get_running_loop().create_task(later())
        return None


def test_an_async_batch_answered_by_its_senders_after_execute_returned() -> None:
    runtime = WorkerRuntime()
    side = SideWork(runtime)
    triton = TritonModel(SendsLater(), Path("/nonexistent/m/1"), CONFIG, threads=runtime.threads)
    runner = runner_for(triton, SIG, RegionCache(), CPU, None, runtime, side)
    reqs, frames = _requests(2)
    sent = Sent()
    try:
        with Reply(1, reqs, sent) as reply:
            reply.outcome = runner.run(1, False, reqs, frames, reply)
        deadline = time.monotonic() + 10
        while not sent.results and time.monotonic() < deadline:
            side.tend(lambda *_: None, sent)
            time.sleep(0.005)
    finally:
        runtime.close()
    (result,) = sent.results
    assert [(r.id, r.status) for r in result.results] == [(0, Status.OK), (1, Status.OK)]
