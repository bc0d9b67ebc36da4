"""The rate limiter on a stateful model (``instance_group.rate_limiter`` with ``sequence_batching``).

Two instances of a sequence model and one of a plain model share a global resource of count 1 on a real
``zinfer serve --rate-limit-resource ONE:1``: their executions (logged by the models with their start
and end times) must never overlap, while every sequence still gets its own running sums and both models
take turns. A sequence model whose instance needs more than the server has fails, as a plain one does.
"""

from __future__ import annotations

import shutil
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server
from zinfer.client import Client
from zinfer.client.errors import Unavailable

pytestmark = pytest.mark.integration

SEQ = """
    import os
    import time

    import numpy as np


    class Model:
        def initialize(self, config):
            self.log = config["parameters"]["log"]["string_value"]
            self.sums = {}

        def execute(self, inputs):
            begin = time.monotonic()
            out = np.empty((len(inputs["X"]), 1), np.float32)
            rows = zip(inputs["X"].reshape(-1), inputs["START"].reshape(-1), inputs["CORRID"].reshape(-1))
            for row, (x, start, sid) in enumerate(rows):
                total = (0.0 if start else self.sums[int(sid)]) + float(x)
                self.sums[int(sid)] = total
                out[row, 0] = total
            time.sleep(0.01)
            with open(self.log, "a") as f:
                f.write(f"seq {os.getpid()} {begin:.6f} {time.monotonic():.6f}\\n")
            return {"SUM": out}
"""

PLAIN = """
    import os
    import time


    class Model:
        def initialize(self, config):
            self.log = config["parameters"]["log"]["string_value"]

        def execute(self, inputs):
            begin = time.monotonic()
            time.sleep(0.01)
            with open(self.log, "a") as f:
                f.write(f"plain {os.getpid()} {begin:.6f} {time.monotonic():.6f}\\n")
            return {"Y": inputs["X"] + 1}
"""


def _config(name: str, log: Path, count: int, need: int, sequence: bool) -> str:
    limiter = f"rate_limiter {{ resources [ {{ name: 'ONE' global: true count: {need} }} ] }}"
    seq = """
        sequence_batching {
          direct { }
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
          ]
        }
    """
    output = "SUM" if sequence else "Y"
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        {seq if sequence else ""}
        instance_group [ {{ kind: KIND_CPU count: {count} {limiter} }} ]
        parameters {{ key: "log" value: {{ string_value: "{log}" }} }}
    """


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repo = tmp_path_factory.mktemp("repo")
    log = repo / "executions.log"
    for name, count, need, code in (("seq", 2, 1, SEQ), ("plain", 1, 1, PLAIN), ("greedy", 1, 2, SEQ)):
        (repo / name / "1").mkdir(parents=True)
        config = _config(name, log, count, need, sequence=code is SEQ)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    s = start_server(repo, "--rate-limit-resource", "ONE:1")
    yield s, log
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)


def _executions(log: Path) -> list[tuple[str, int, float, float]]:
    rows = []
    for line in log.read_text().splitlines():
        name, pid, begin, end = line.split()
        rows.append((name, int(pid), float(begin), float(end)))
    return sorted(rows, key=lambda r: r[2])


def test_a_sequence_model_never_holds_the_resource_twice(setup: tuple[ServerProcess, Path]) -> None:
    server, log = setup
    log.unlink(missing_ok=True)
    steps = 8
    sums: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def sequence(sid: int) -> None:
        try:
            with Client(server.url, timeout=30) as c:
                out = []
                for i in range(steps):
                    x = np.full((1, 1), sid, np.float32)
                    first, last = i == 0, i == steps - 1
                    r = c.infer("seq", {"X": x}, sequence_id=sid, sequence_start=first, sequence_end=last)
                    out.append(float(r.as_numpy("SUM")[0, 0]))
                sums[sid] = out
        except BaseException as exc:
            errors.append(exc)

    def plain(base: int) -> None:
        try:
            with Client(server.url, timeout=30) as c:
                for j in range(steps):
                    x = np.full((1, 1), base + j, np.float32)
                    assert c.infer("plain", {"X": x}).as_numpy("Y")[0, 0] == base + j + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sequence, args=(sid,)) for sid in (1, 2, 3, 4)]
    threads += [threading.Thread(target=plain, args=(base,)) for base in (100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for sid in (1, 2, 3, 4):
        assert sums[sid] == [float(sid) * (i + 1) for i in range(steps)], (sid, sums[sid])
    runs = _executions(log)
    assert {r[0] for r in runs} == {"seq", "plain"}
    assert len({r[1] for r in runs if r[0] == "seq"}) == 2  # both instances of the sequence model ran
    for before, after in zip(runs, runs[1:], strict=False):
        assert after[2] >= before[3], f"{before} overlaps {after}"
    switches = sum(1 for x, y in zip(runs, runs[1:], strict=False) if x[0] != y[0])
    assert switches >= 4, [r[0] for r in runs]  # the models took turns


def test_a_sequence_instance_needing_more_than_the_server_has_fails_its_model(
    setup: tuple[ServerProcess, Path],
) -> None:
    server, _ = setup
    with Client(server.url, timeout=30) as c:
        with pytest.raises(Unavailable, match="rate limiter.*'ONE'"):
            c.infer("greedy", {"X": np.ones((1, 1), np.float32)}, sequence_id=1, sequence_start=True)
        assert not c.is_model_ready("greedy")
        assert c.is_model_ready("seq")
