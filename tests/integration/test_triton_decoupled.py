"""Triton-style decoupled models, async execute, cancellation and BLS streams, over a real server.

Every model here is written for this test (none is Triton's): ``repeat`` answers from a thread after
``execute`` returned, ``countdown`` from ``execute`` itself with the last response carrying the final
flag, ``nothing`` sends only the flag; the broken ones end their streams with an error, never a hang.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, start_server, stop_all, wait_for
from zinfer.client import AsyncClient, Client
from zinfer.client.errors import Cancelled, DeadlineExceeded, InternalError, ServerError, Unavailable

pytestmark = pytest.mark.integration

REPEAT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.answer, args=(values, sender))
            thread.start()
            self.threads.append(thread)
        return None  # the responses come from the threads, after execute returned

    def answer(self, values, sender):
        for i, v in enumerate(values):
            out = [pb_utils.Tensor("OUT", np.array([v], np.int32)),
                   pb_utils.Tensor("IDX", np.array([i], np.uint32))]
            sender.send(pb_utils.InferenceResponse(output_tensors=out))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException as exc:
            pb_utils.Logger.log_warn(f"repeat: after final: {exc}")

    def finalize(self):
        for t in self.threads:
            t.join()
"""

COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if n == 0:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # no response at all
                continue
            if n < 0:
                error = pb_utils.TritonError("negative counts are refused", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(n, 0, -1):
                out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32)),
                                                  pb_utils.Tensor("IDX", np.array([n - i], np.uint32))])
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == 1 else 0)
        return None
"""

BROKEN = """
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        kind = int(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
        if kind == 1:
            return None  # never sends, keeps no sender: the request must end with an error
        if kind == 2:
            raise pb_utils.TritonModelException("execute broke")
        if kind == 3:
            return [pb_utils.InferenceResponse([])]  # a decoupled model must return None
        sender = requests[0].get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([kind], np.int32)),
                                                pb_utils.Tensor("IDX", np.array([0], np.uint32))]))
        self.kept = sender  # holds the sender and never finishes
        if kind == 4:  # the worker dies with the stream open (kind 5: the execution limit ends it)
            threading.Thread(target=lambda: (time.sleep(0.2), os._exit(3))).start()
        return None
"""

TICKER = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.tick, args=(request.get_response_sender(),)).start()

    def tick(self, sender):
        deadline = time.monotonic() + 30
        i = 0
        while not sender.is_cancelled() and time.monotonic() < deadline:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32)),
                                                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            i += 1
            time.sleep(0.02)
        pb_utils.Logger.log_info(f"ticker: cancelled={sender.is_cancelled()}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

PATIENT = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            pb_utils.Logger.log_info(f"patient: running {request.request_id()}")
            deadline = time.monotonic() + 30
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            pb_utils.Logger.log_info(f"patient: cancelled={request.is_cancelled()}")
            error = pb_utils.TritonError("stopped early", pb_utils.TritonError.CANCELLED)
            out.append(pb_utils.InferenceResponse(error=error))
        return out
"""

ASYNC_BLS = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

LOOPS = set()


class TritonPythonModel:
    async def execute(self, requests):
        LOOPS.add(id(asyncio.get_running_loop()))
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            name = np.array([b"identity"], dtype=np.bytes_)[0]  # a name as NumPy string tensors give it
            calls = [pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", x * k)]).async_exec()
                     for k in (1, 2)]
            answers = await asyncio.gather(*calls)
            y = sum(pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy() for a in answers)
            # BLS on a decoupled model: every response, sync and async
            stream = pb_utils.InferenceRequest(model_name="countdown", requested_output_names=["OUT"],
                                               inputs=[pb_utils.Tensor("IN", np.array([3], np.int32))])
            sync = [r for r in stream.exec(decoupled=True)]
            got = [r async for r in await stream.async_exec(decoupled=True)]
            counts = [int(r.output_tensors()[0].as_numpy()[0]) for r in sync + got if r.output_tensors()]
            bad = pb_utils.InferenceRequest(model_name="countdown", requested_output_names=["OUT"],
                                            inputs=[pb_utils.Tensor("IN", np.array([-1], np.int32))])
            errors = [r for r in bad.exec(decoupled=True) if r.has_error()]
            missing = pb_utils.InferenceRequest(model_name=b"no_such_model", requested_output_names=["Y"],
                                                inputs=[pb_utils.Tensor("X", x)]).exec()
            assert missing.has_error() and missing.error().code() == pb_utils.TritonError.NOT_FOUND
            assert len(errors) == 1 and errors[0].error().code() == pb_utils.TritonError.INVALID_ARG, errors
            pb_utils.Logger.log_info(f"async_bls: counts={counts} loops={len(LOOPS)}")
            info = np.array([len(LOOPS)] + counts, np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), pb_utils.Tensor("INFO", info)]))
        return out
"""

STREAM_IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""


def _model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("decoupled") / "models"
    repo.mkdir()
    shutil.copytree(MODELS / "identity", repo / "identity")
    _model(repo, "repeat", REPEAT, "max_batch_size: 0\n" + STREAM_IO)
    _model(repo, "countdown", COUNTDOWN, "max_batch_size: 0\n" + STREAM_IO)
    _model(repo, "ticker", TICKER, "max_batch_size: 0\n" + STREAM_IO)
    _model(repo, "broken", BROKEN, "max_batch_size: 0\n" + STREAM_IO
           + 'parameters { key: "execution_timeout_ms" value: { string_value: "1500" } }\n')  # fmt: skip
    _model(repo, "patient", PATIENT, "max_batch_size: 0\n"
           'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')  # fmt: skip
    _model(repo, "async_bls", ASYNC_BLS, "max_batch_size: 0\n"
           'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, -1 ] } ]\n'
           'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1, -1 ] }, '
           '{ name: "INFO" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')  # fmt: skip
    s = start_server(repo)
    yield s
    stop_all([s])


def _values(results: list) -> list[tuple[int, int]]:  # type: ignore[type-arg]
    return [(int(r.as_numpy("OUT")[0]), int(r.as_numpy("IDX")[0])) for r in results if not r.final]


def test_responses_from_a_thread_after_execute_returned(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        results = list(c.stream("repeat", {"IN": np.array([4, 5, 6], np.int32)}))
    assert _values(results) == [(4, 0), (5, 1), (6, 2)]
    assert results[-1].final and sum(r.final for r in results) == 1 and results[-1].output_names == []
    # sending after the final flag raised, with Triton's text
    wait_for(lambda: "Response sender has been closed" in server.log(), 10, "the after-final error")


def test_each_response_reaches_the_client_as_it_is_sent(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        stream = c.stream("ticker", {"IN": np.array([0], np.int32)})
        first = next(stream)  # the ticker never ends by itself: this one came while it still runs
        assert not first.final and int(first.as_numpy("IDX")[0]) == 0
        second = next(stream)
        assert int(second.as_numpy("IDX")[0]) == 1
        stream.close()  # leaving the stream cancels the request in the server
    wait_for(lambda: "ticker: cancelled=True" in server.log(), 10, "the sender to see the cancel")


def test_final_flag_with_the_last_response_and_alone(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        results = list(c.stream("countdown", {"IN": np.array([3], np.int32)}))
        # the last response carries outputs and the final flag together
        assert [(int(r.as_numpy("OUT")[0]), r.final) for r in results] == [(3, False), (2, False), (1, True)]
        nothing = list(c.stream("countdown", {"IN": np.array([0], np.int32)}))
        assert len(nothing) == 1 and nothing[0].final and nothing[0].output_names == []
        with pytest.raises(ServerError, match="negative counts are refused"):
            list(c.stream("countdown", {"IN": np.array([-1], np.int32)}))


def test_async_client_streams_many_at_once(server: ServerProcess) -> None:
    async def main() -> list[list[tuple[int, int]]]:
        async with AsyncClient(server.url, timeout=30) as c:

            async def one(n: int) -> list[tuple[int, int]]:
                got = [r async for r in c.stream("repeat", {"IN": np.arange(n, dtype=np.int32)})]
                assert got[-1].final
                return _values(got)

            return await asyncio.gather(*(one(n) for n in range(1, 9)))

    for n, got in enumerate(asyncio.run(main()), start=1):
        assert got == [(i, i) for i in range(n)]


@pytest.mark.parametrize(
    "kind, error, text",
    [
        (1, InternalError, "released without sending the final flag"),
        (2, InternalError, "execute broke"),
        (3, InternalError, "must return None"),
        (4, Unavailable, "instance failed"),
        (5, DeadlineExceeded, "execution limit"),
    ],
)
def test_streams_that_cannot_finish_end_with_an_error(
    server: ServerProcess, kind: int, error: type[ServerError], text: str
) -> None:
    with Client(server.url, timeout=30) as c:
        got = []
        with pytest.raises(error, match=text):
            for r in c.stream("broken", {"IN": np.array([kind], np.int32)}):
                got.append(r)
        if kind in (4, 5):
            assert len(got) == 1 and int(got[0].as_numpy("OUT")[0]) == kind  # sent before it broke
        # the model serves again afterwards (a new instance after 4 and 5)
        wait_for(lambda: c.is_model_ready("broken"), 30, "the broken model to be ready again")
        with pytest.raises(InternalError, match="released without"):
            list(c.stream("broken", {"IN": np.array([1], np.int32)}))


def test_is_cancelled_inside_a_running_execute(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as c:
        errors: list[BaseException] = []

        def call() -> None:
            try:
                c.infer("patient", {"X": np.ones(2, np.float32)}, request_id="slow-1")
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
                errors.append(exc)

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: "patient: running slow-1" in server.log(), 10, "execute to start")
        assert c.cancel("slow-1")
        t.join(30)
        assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)
    wait_for(lambda: "patient: cancelled=True" in server.log(), 10, "execute to see the cancel")


def test_async_execute_and_bls_streams(server: ServerProcess) -> None:
    x = np.array([[1.0, 2.0]], np.float32)
    with Client(server.url, timeout=60) as c:
        for _ in range(2):
            result = c.infer("async_bls", {"X": x})
            np.testing.assert_array_equal(result.as_numpy("Y"), 3 * x)
            info = result.as_numpy("INFO").tolist()
            assert info[0] == 1  # one event loop, the same for every call
            assert info[1:] == [3, 2, 1, 3, 2, 1]  # the stream's responses, through exec and async_exec
