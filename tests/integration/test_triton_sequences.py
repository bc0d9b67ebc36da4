"""A stateful model written for Triton's Python backend, unchanged, under sequence batching.

``TritonPythonModel`` reads the control inputs START, END, READY and CORRID of each request with
``pb_utils.get_input_tensor_by_name`` and keeps a running sum per correlation id, as such models do in
Triton (and checks ``request.correlation_id()`` and ``request.flags()``). Interleaved sequences must each
get their own running sums, with the ``oldest`` strategy (up to four sequences per batch) and with
``direct`` on two instances; END must release the model's state for that sequence.
"""

from __future__ import annotations

import shutil
import textwrap
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument

pytestmark = pytest.mark.integration

MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}  # correlation id -> running sum, from START until END

        def execute(self, requests):
            responses = []
            for request in requests:
                controls = {}
                for name in ("START", "END", "READY", "CORRID"):
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise pb_utils.TritonModelException(f"control input {name} is missing")
                    controls[name] = tensor.as_numpy()
                value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
                key = int(controls["CORRID"].reshape(-1)[0])
                if controls["READY"].reshape(-1)[0] != 1:
                    raise pb_utils.TritonModelException("READY is not set on a request that runs")
                if request.correlation_id() != key:
                    raise pb_utils.TritonModelException(f"correlation_id() {request.correlation_id()!r}")
                if controls["START"].reshape(-1)[0]:
                    self.sums[key] = np.zeros_like(value)
                elif key not in self.sums:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"no state for sequence {key!r}")))
                    continue
                total = self.sums[key] + value
                if controls["END"].reshape(-1)[0]:
                    del self.sums[key]  # the sequence is over: its state goes
                else:
                    self.sums[key] = total
                live = np.full(value.shape, len(self.sums), np.int32)
                shapes = [list(controls[n].shape) for n in ("START", "END", "READY", "CORRID")]
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT", total),
                    pb_utils.Tensor("LIVE", live),
                    pb_utils.Tensor("SHAPES", np.array([shapes], np.int32).reshape(1, -1)),
                    pb_utils.Tensor("FLAGS", np.full(value.shape, request.flags(), np.int32)),
                ]))
            return responses

        def finalize(self):
            self.sums.clear()
"""


OLDEST = "triton_seq"
DIRECT = "triton_seq_direct"
MODELS = {  # name: (strategy, instances)
    OLDEST: ("oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }", 1),
    DIRECT: ("direct { }", 2),  # each sequence stays on one of two instances, with its state
}


def _config(name: str, strategy: str, count: int) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [
          {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
          {{ name: "LIVE" data_type: TYPE_INT32 dims: [ 1 ] }},
          {{ name: "SHAPES" data_type: TYPE_INT32 dims: [ 8 ] }},
          {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }}
        ]
        sequence_batching {{
          max_sequence_idle_microseconds: 5000000
          {strategy}
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
          ]
        }}
        instance_group [ {{ kind: KIND_CPU count: {count} }} ]
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    for name, (strategy, count) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(_config(name, strategy, count)))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)


def _step(
    client: Client, model: str, sid: int, v: int, start: bool = False, end: bool = False
) -> tuple[int, int]:
    """(running sum, sequences the instance holds state for after this request)"""
    x = np.array([[v]], np.int32)
    r = client.infer(model, {"INPUT": x}, sequence_id=sid, sequence_start=start, sequence_end=end)
    assert r.as_numpy("SHAPES").tolist() == [[1, 1] * 4]  # each control is one [1, 1] row per request
    assert r.as_numpy("FLAGS")[0, 0] == (1 if start else 0) | (2 if end else 0)  # Triton's request flags
    return int(r.as_numpy("OUTPUT")[0, 0]), int(r.as_numpy("LIVE")[0, 0])


@pytest.mark.parametrize("model", [OLDEST, DIRECT])
def test_interleaved_sequences_keep_their_own_state(server: ServerProcess, model: str) -> None:
    steps = 10
    ids = [11, 12, 13, 14, 15, 16]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(ids))

    def run(index: int, sid: int) -> None:
        try:
            with Client(server.url, timeout=30) as client:
                barrier.wait(10)
                out = []
                for i in range(steps):
                    total, _ = _step(client, model, sid, index + 1, start=i == 0, end=i == steps - 1)
                    out.append(total)
                results[sid] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, sid)) for i, sid in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == len(ids)
    for index, sid in enumerate(ids):
        assert results[sid] == [(index + 1) * (i + 1) for i in range(steps)], (sid, results[sid])
    with Client(server.url, timeout=30) as client:  # every sequence ended: no instance holds state
        assert _step(client, model, ids[0], 5, start=True) == (5, 1)
        assert _step(client, model, ids[0], 1, end=True) == (6, 0)
    sizes = _batch_sizes(server, model)
    assert max(sizes) <= 4, sizes  # never more than max_candidate_sequences (or max_batch_size)
    if model == OLDEST:
        assert max(sizes) > 1, sizes  # sequences did share batches


def _batch_sizes(server: ServerProcess, model: str) -> list[int]:
    with Client(server.url, timeout=30) as client:
        stats = client.statistics(model)["model_stats"][0]
    return [b["batch_size"] for b in stats["batch_stats"]]


def test_end_releases_the_sequence_state(server: ServerProcess) -> None:
    model = OLDEST
    with Client(server.url, timeout=30) as client:
        assert _step(client, model, 101, 1, start=True) == (1, 1)
        assert _step(client, model, 102, 10, start=True) == (10, 2)
        assert _step(client, model, 101, 2) == (3, 2)
        assert _step(client, model, 101, 3, end=True) == (6, 1)  # 101's state is gone, 102's stays
        with pytest.raises(InvalidArgument, match="sequence 101 to model .* must specify the START flag"):
            _step(client, model, 101, 1)  # the broker knows it ended too
        assert _step(client, model, 102, 5, end=True) == (15, 0)
        assert _step(client, model, 101, 7, start=True) == (7, 1)  # the id may start over
        assert _step(client, model, 101, 0, end=True) == (7, 0)


def test_a_string_sequence_id_is_refused_where_the_corrid_control_is_a_number(server: ServerProcess) -> None:
    """CORRID is TYPE_UINT64 here: a string id has no value the model could be given (Triton's qa serves
    string ids from a copy of the model whose CORRID is TYPE_STRING), so the request fails, clearly, and
    integer sequences are unaffected."""
    x = np.array([[1]], np.int32)
    with Client(server.url, timeout=30) as client:
        for model in MODELS:
            with pytest.raises(
                InvalidArgument, match=r"sequence 'abc' .* CORRID control 'CORRID' to be TYPE_STRING"
            ):
                client.infer(model, {"INPUT": x}, sequence_id="abc", sequence_start=True)
            assert _step(client, model, 301, 4, start=True)[0] == 4
            assert _step(client, model, 301, 1, end=True)[0] == 5
