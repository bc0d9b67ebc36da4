"""Implicit sequence state (``sequence_batching { state [...] }``) over a real server: a native and a
Triton-style model keep a running sum in state the worker holds, under both strategies; initial state from
zeros and from a file; END drops it; a bad state config fails only that model."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument, Unavailable

pytestmark = pytest.mark.integration

NATIVE = """
import numpy as np

class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        total = inputs["STATE_IN"] + inputs["X"]
        return {"SUM": total, "STATE_OUT": total}
"""

TRITON = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            state = pb_utils.get_input_tensor_by_name(r, "STATE_IN").as_numpy()
            total = (state + x).astype(np.float32)
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total), pb_utils.Tensor("STATE_OUT", total)]))
        return out
"""


def _model(repo: Path, name: str, code: str, strategy: str, initial: str, count: int = 1) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"sequence_batching {{ {strategy}\n"
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]\n'
        f"    {initial} }} ] }}\n"
        f"instance_group [ {{ kind: KIND_CPU count: {count} }} ]\n"
    )


ZEROS = 'initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" }'
FROM_FILE = 'initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "hundred.bin" name: "hundred" }'
OLDEST = "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("state")
    _model(repo, "native_direct", NATIVE, "direct { }", ZEROS, count=2)
    _model(repo, "native_oldest", NATIVE, OLDEST, "")
    _model(repo, "triton_oldest", TRITON, OLDEST, ZEROS)
    _model(repo, "from_file", NATIVE, "direct { }", FROM_FILE)
    (repo / "from_file" / "1" / "initial_state").mkdir()
    (repo / "from_file" / "1" / "initial_state" / "hundred.bin").write_bytes(np.float32([100]).tobytes())
    _model(repo, "bad_file", NATIVE, "direct { }", FROM_FILE)  # no such file
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)


def _step(c: Client, model: str, sid: int, v: float, start: bool = False, end: bool = False) -> float:
    r = c.infer(model, {"X": np.array([[v]], np.float32)}, sequence_id=sid, sequence_start=start,
                sequence_end=end)  # fmt: skip
    return float(r.as_numpy("SUM").reshape(-1)[0])


@pytest.mark.parametrize("model", ["native_direct", "native_oldest", "triton_oldest"])
def test_interleaved_sequences_keep_their_own_state(server: ServerProcess, model: str) -> None:
    errors: list[BaseException] = []

    def run(sid: int) -> None:
        try:
            with Client(server.url) as c:
                values = [float(sid + k) for k in range(6)]
                got = [_step(c, model, sid, v, start=k == 0, end=k == 5) for k, v in enumerate(values)]
                assert got == list(np.cumsum(values)), (sid, got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(1000 + 10 * i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_start_resets_and_end_forgets(server: ServerProcess) -> None:
    with Client(server.url) as c:
        assert _step(c, "native_oldest", 7, 1.0, start=True) == 1.0
        assert _step(c, "native_oldest", 7, 2.0) == 3.0
        assert (
            _step(c, "native_oldest", 7, 5.0, start=True) == 5.0
        )  # START begins again from the initial state
        assert _step(c, "native_oldest", 7, 1.0, end=True) == 6.0
        with pytest.raises(InvalidArgument):
            _step(c, "native_oldest", 7, 1.0)  # ended: a new START is needed
        assert _step(c, "native_oldest", 7, 4.0, start=True) == 4.0


def test_initial_state_from_a_file_and_a_missing_file(server: ServerProcess) -> None:
    with Client(server.url) as c:
        assert _step(c, "from_file", 3, 1.0, start=True) == 101.0
        assert _step(c, "from_file", 3, 1.0, end=True) == 102.0
        with pytest.raises(Unavailable, match="hundred.bin"):
            _step(c, "bad_file", 3, 1.0, start=True)
        with pytest.raises(InvalidArgument, match="STATE_IN"):  # clients cannot send the state
            one = np.ones((1, 1), np.float32)
            c.infer("native_oldest", {"X": one, "STATE_IN": one}, sequence_id=9, sequence_start=True)
