"""Triton's quickstart sequence models, ``simple_sequence`` and ``simple_dyna_sequence``, served by zinfer's
front door to the real tritonclient, grpc (stream and sync) and http, unchanged.

The configs are Triton's docs/examples/model_repository ones, sequence_batching block included (control
inputs, ``oldest`` strategy, idle timeout, instance groups), with only ``platform`` replaced by
``backend: "python"``: Triton ships these models as TensorFlow graphdef / ONNX files, which zinfer does not
run, so each is a ``TritonPythonModel`` stand-in written here that answers as the original does.

What the originals compute (qa/common/gen_qa_sequence_models.py and gen_qa_dyna_sequence_models.py, the
batching variants, ``max_batch_size: 8``): they hold no accumulator (a TF variable would pin the output to
the variable's size), each request's OUTPUT is ``INPUT + START`` when READY is set (0 when not), and for the
dyna model ``INPUT + START + END * CORRID``. Triton's example clients check exactly that: the first answer
of a sequence is its input plus one, the last of a dyna sequence has the correlation id added.

The dyna clients (``-d``) also send a string sequence id ("1002") to ``simple_string_dyna_sequence``, which
Triton's qa (L0_grpc) derives from ``simple_dyna_sequence``: the same config under that name, CORRID of
``TYPE_STRING`` and the ``dyna_sequence`` custom backend, a real accumulator per correlation id (START sets
it to the input, later requests add theirs, END adds the id's numeric value). That model's stand-in keeps
its state per correlation id in the instance (two instances: the sequence batcher must keep a sequence on
one). Without ``-d`` the string id is a UUID sent to ``simple_sequence``, which has no CORRID input.

The calls are those of Triton's client examples simple_grpc_sequence_stream_infer_client.py
(start_stream, async_stream_infer with request ids ``<sequence>_<n>``, answers matched by response id),
simple_grpc_sequence_sync_infer_client.py and simple_http_sequence_sync_infer_client.py, each with and
without ``--dyna``; and the same sequences sent interleaved, one request of each in turn."""

from __future__ import annotations

import queue
import textwrap
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.frontdoor_helpers import serve_front_doors

pytestmark = pytest.mark.integration

TIMEOUT = 30.0  # seconds: every call and every stream receive

# Triton's docs/examples/model_repository/simple_sequence/config.pbtxt, platform swapped for the backend.
SIMPLE_SEQUENCE = """name: "simple_sequence"
backend: "python"
max_batch_size: 8
sequence_batching {
  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    }
  ]
}
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
instance_group [
  {
    kind: KIND_CPU
  }
]
"""

# Triton's docs/examples/model_repository/simple_dyna_sequence/config.pbtxt, platform swapped likewise.
SIMPLE_DYNA_SEQUENCE = """name: "simple_dyna_sequence"
backend: "python"
max_batch_size: 8
sequence_batching {
    max_sequence_idle_microseconds: 10000000
    oldest {
      max_candidate_sequences: 1024
      max_queue_delay_microseconds: 10000
    }

  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "END"
      control [
        {
          kind: CONTROL_SEQUENCE_END
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "CORRID"
      control [
        {
          kind: CONTROL_SEQUENCE_CORRID
          data_type: TYPE_UINT64
        }
      ]
    }
  ]
}
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
parameters [
  {
    key: "execute_delay_ms"
    value: { string_value: "3" }
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
"""

# What Triton's qa does to make simple_string_dyna_sequence: the name, and CORRID as a string.
SIMPLE_STRING_DYNA_SEQUENCE = SIMPLE_DYNA_SEQUENCE.replace(
    '"simple_dyna_sequence"', '"simple_string_dyna_sequence"'
).replace("data_type: TYPE_UINT64", "data_type: TYPE_STRING")

# The graphdef's arithmetic: OUTPUT = INPUT + START while READY, 0 otherwise; no state between requests.
STATELESS_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    def _control(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy().astype(np.int64)


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = _control(request, "INPUT")
                start, ready = _control(request, "START"), _control(request, "READY")
                end, corrid = _control(request, "END"), _control(request, "CORRID")
                if start is None or ready is None:
                    raise pb_utils.TritonModelException("the START and READY control inputs are missing")
                total = value + start
                if corrid is not None:  # the dyna model also has END and CORRID
                    total = total + end * corrid
                out = np.where(ready == 1, total, 0).astype(np.int32)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
            return responses
"""

# The dyna_sequence custom backend's arithmetic: a running sum per correlation id (the CORRID string read
# as a number), set by START, the id added on END, the state dropped then.
ACCUMULATOR_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}

        def execute(self, requests):
            responses = []
            for request in requests:
                get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                value = get("INPUT").astype(np.int64)
                start, end, ready = (int(get(n).reshape(-1)[0]) for n in ("START", "END", "READY"))
                raw = get("CORRID").reshape(-1)[0]
                corrid = raw.decode() if isinstance(raw, bytes) else str(raw)
                if not ready:
                    responses.append(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("OUTPUT", np.zeros(value.shape, np.int32))]))
                    continue
                if str(request.correlation_id()) != corrid:
                    raise pb_utils.TritonModelException(
                        f"CORRID {corrid!r} is not the request's {request.correlation_id()!r}")
                if start:
                    total = value
                elif corrid in self.sums:
                    total = self.sums[corrid] + value
                else:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"sequence {corrid} has no state here")))
                    continue
                if end:
                    self.sums.pop(corrid, None)
                    total = total + int(corrid)
                else:
                    self.sums[corrid] = total
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT", total.astype(np.int32))]))
            return responses
"""

VALUES = [11, 7, 5, 3, 2, 0, 1]  # the example clients' values
INT_IDS = (1000, 1001)  # their two integer sequence ids (offset 0)


def _write(repo: Path, name: str, config: str, model: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(model))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = tmp_path_factory.mktemp("sequence_quickstart") / "model_repository"
    _write(repo, "simple_sequence", SIMPLE_SEQUENCE, STATELESS_MODEL)
    _write(repo, "simple_dyna_sequence", SIMPLE_DYNA_SEQUENCE, STATELESS_MODEL)
    _write(repo, "simple_string_dyna_sequence", SIMPLE_STRING_DYNA_SEQUENCE, ACCUMULATOR_MODEL)
    with serve_front_doors(repo) as urls:
        yield urls


class Plan:
    """The three sequences an example client sends (``dyna``: its ``-d`` flag) and what it expects back."""

    def __init__(self, dyna: bool) -> None:
        self.dyna = dyna
        self.int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
        self.string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
        self.string_id = "1002" if dyna else str(uuid.uuid4())
        negated = [-v for v in VALUES]
        self.sequences: list[tuple[str, int | str, list[int]]] = [
            (self.int_model, INT_IDS[0], [0, *VALUES]),
            (self.int_model, INT_IDS[1], [100, *negated]),
            (self.string_model, self.string_id, [20, *negated]),
        ]

    def expected(self, index: int) -> list[int]:
        _, sid, inputs = self.sequences[index]
        if index == 2 and self.dyna:  # the dyna_sequence backend: a running sum, the id added at the end
            sums = list(np.cumsum(inputs))
            sums[-1] += int(sid)
            return [int(v) for v in sums]
        out = [v + (1 if k == 0 else 0) for k, v in enumerate(inputs)]  # INPUT + START
        if self.dyna:
            out[-1] += int(sid)  # + END * CORRID
        return out


def _input(mod: Any, value: int) -> list[Any]:
    data = np.full(shape=[1, 1], fill_value=value, dtype=np.int32)  # batch_size 1, as the clients use
    inp = mod.InferInput("INPUT", list(data.shape), "INT32")
    inp.set_data_from_numpy(data)
    return [inp]


def _answer(result: Any) -> int:
    out = result.as_numpy("OUTPUT")
    assert out.shape == (1, 1) and out.dtype == np.int32, (out.shape, out.dtype)
    return int(out[0][0])


@pytest.fixture
def http(door: tuple[str, str]) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(door[0], connection_timeout=TIMEOUT, network_timeout=TIMEOUT)
    yield c
    c.close()


@pytest.fixture
def grpc(door: tuple[str, str]) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(door[1])
    yield c
    c.close()


def _sync_send(mod: Any, client: Any, model: str, sid: int | str, value: int, count: int, total: int) -> int:
    """One request of the sync clients' ``sync_send``: start on the first, end on the last."""
    extra = {"client_timeout": TIMEOUT} if mod is grpcclient else {}
    result = client.infer(
        model_name=model,
        inputs=_input(mod, value),
        outputs=[mod.InferRequestedOutput("OUTPUT")],
        sequence_id=sid,
        sequence_start=(count == 1),
        sequence_end=(count == total),
        **extra,
    )
    return _answer(result)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sequence_sync_infer_client(
    protocol: str, dyna: bool, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """simple_{grpc,http}_sequence_sync_infer_client.py: each sequence sent whole, one after the other."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    plan = Plan(dyna)
    for index, (model, sid, inputs) in enumerate(plan.sequences):
        got = [_sync_send(mod, client, model, sid, v, k + 1, len(inputs)) for k, v in enumerate(inputs)]
        assert got == plan.expected(index), (model, sid)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sequences_interleaved_request_by_request(
    protocol: str, dyna: bool, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    """The same sequences, one request of each in turn: three sequences live at once on the model."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = http if protocol == "http" else grpc
    plan = Plan(dyna)
    got: list[list[int]] = [[] for _ in plan.sequences]
    total = len(plan.sequences[0][2])
    for k in range(total):
        for index, (model, sid, inputs) in enumerate(plan.sequences):
            got[index].append(_sync_send(mod, client, model, sid, inputs[k], k + 1, total))
    for index in range(len(plan.sequences)):
        assert got[index] == plan.expected(index), plan.sequences[index][:2]


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_grpc_sequence_stream_infer_client(dyna: bool, door: tuple[str, str]) -> None:
    """simple_grpc_sequence_stream_infer_client.py: one stream, every request of the three sequences sent
    at once (request ids ``<sequence id>_<n>``), the answers sorted back by the response id."""
    plan = Plan(dyna)
    answers: queue.Queue[Any] = queue.Queue()

    def callback(q: queue.Queue[Any], result: Any, error: Any) -> None:
        q.put(error if error else result)

    with grpcclient.InferenceServerClient(url=door[1]) as client:
        client.start_stream(callback=partial(callback, answers), stream_timeout=TIMEOUT * 2)
        for model, sid, inputs in plan.sequences:
            for count, value in enumerate(inputs, start=1):
                client.async_stream_infer(
                    model_name=model,
                    inputs=_input(grpcclient, value),
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sid}_{count}",
                    sequence_id=sid,
                    sequence_start=(count == 1),
                    sequence_end=(count == len(inputs)),
                )
        received: dict[str, list[int]] = {str(sid): [] for _, sid, _ in plan.sequences}
        for _ in range(sum(len(inputs) for _, _, inputs in plan.sequences)):
            item = answers.get(timeout=TIMEOUT)
            assert not isinstance(item, InferenceServerException), item
            this_id = item.get_response().id.split("_")[0]  # as the client splits it
            assert this_id in received, f"unexpected sequence id returned by the server: {this_id}"
            received[this_id].append(_answer(item))
        client.stop_stream()
    for index, (_, sid, _) in enumerate(plan.sequences):
        assert received[str(sid)] == plan.expected(index), sid  # a sequence's answers come in order


def test_configs_reach_the_client_as_triton_ships_them(grpc: grpcclient.InferenceServerClient) -> None:
    from tritonclient.grpc import model_config_pb2 as mc

    config = grpc.get_model_config("simple_dyna_sequence", client_timeout=TIMEOUT).config
    sb = config.sequence_batching
    assert config.max_batch_size == 8 and sb.max_sequence_idle_microseconds == 10_000_000
    assert sb.oldest.max_candidate_sequences == 1024 and sb.oldest.max_queue_delay_microseconds == 10_000
    kinds = {c.name: mc.ModelSequenceBatching.Control.Kind.Name(c.control[0].kind) for c in sb.control_input}
    assert kinds == {
        "START": "CONTROL_SEQUENCE_START",
        "END": "CONTROL_SEQUENCE_END",
        "READY": "CONTROL_SEQUENCE_READY",
        "CORRID": "CONTROL_SEQUENCE_CORRID",
    }
    assert config.instance_group[0].count == 2
    strings = grpc.get_model_config("simple_string_dyna_sequence", client_timeout=TIMEOUT).config
    corrid = next(c for c in strings.sequence_batching.control_input if c.name == "CORRID")
    assert mc.DataType.Name(corrid.control[0].data_type) == "TYPE_STRING"
    simple = grpc.get_model_config("simple_sequence", client_timeout=TIMEOUT).config
    assert [c.name for c in simple.sequence_batching.control_input] == ["START", "READY"]
