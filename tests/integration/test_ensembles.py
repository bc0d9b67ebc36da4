"""Ensembles over a real server: the bundled text pipeline, a DAG with a join, nesting, step requests
batched with direct traffic, a failing middle step, intermediates in the server's shared memory, load
errors, cancellation and clean shutdown."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, wait_for, zinfer_segments
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument, RequestTimeout, ServerError, Unavailable

pytestmark = pytest.mark.integration

SCALE2 = """
import numpy as np

class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        return {"Y": (2 * inputs["X"]).astype(np.float32)}
"""

ADDONE = """
import time
import numpy as np

class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        x = inputs["X"]
        if (x == 77).any():
            raise ValueError("addone refuses 77")
        if (x == 200).any():
            time.sleep(1.5)
        return {"Y": (x + 1).astype(np.float32)}
"""

SUM2 = """
import numpy as np

class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        return {"S": (inputs["A"] + inputs["B"]).astype(np.float32)}
"""

EXPAND = """
import numpy as np

class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        x = inputs["X"]
        return {"Y": (x * np.arange(200_000, dtype=np.float32)).astype(np.float32)}
"""


def _python(
    repo: Path, name: str, code: str, inputs: list[str], outputs: list[str], delay_us: int = 0
) -> None:
    (repo / name / "1").mkdir(parents=True)
    ins = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in inputs)
    outs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in outputs)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 16\ninput [ {ins} ]\noutput [ {outs} ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    (repo / name / "1" / "model.py").write_text(code)


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def _ensemble(
    repo: Path, name: str, steps: list[str], inputs: dict[str, str], outputs: dict[str, str], mbs: int = 16
) -> None:
    (repo / name / "1").mkdir(parents=True)
    ins = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ {4 if t == "TYPE_FP32" else 1} ] }}'
                    for n, t in inputs.items())  # fmt: skip
    outs = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ 4 ] }}' for n, t in outputs.items())
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\ninput [ {ins} ]\noutput [ {outs} ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ens") / "models"
    for name in ("tokenizer", "rot13", "detokenizer", "text_pipeline", "identity", "text_upper"):
        shutil.copytree(MODELS / name, repo / name)
    _python(repo, "scale2", SCALE2, ["X"], ["Y"], delay_us=30000)
    _python(repo, "addone", ADDONE, ["X"], ["Y"])
    _python(repo, "sum2", SUM2, ["A", "B"], ["S"])
    fp32 = {"X": "TYPE_FP32"}
    # chain: Y = 2 * (2X + 1); the middle step fails where 2X is 77
    _ensemble(repo, "chain", [
        _step("scale2", {"X": "X"}, {"Y": "t1"}),
        _step("addone", {"X": "t1"}, {"Y": "t2"}),
        _step("scale2", {"X": "t2"}, {"Y": "Y"}),
    ], fp32, {"Y": "TYPE_FP32"})  # fmt: skip
    # fanout: A = 2X and B = X + 1 side by side, then S = A + B; A is an output and an intermediate
    _ensemble(repo, "fanout", [
        _step("sum2", {"A": "A", "B": "B"}, {"S": "S"}),  # listed first: it waits for its inputs
        _step("scale2", {"X": "X"}, {"Y": "A"}),
        _step("addone", {"X": "X"}, {"Y": "B"}),
    ], fp32, {"S": "TYPE_FP32", "A": "TYPE_FP32"})  # fmt: skip
    # nested: an ensemble step inside an ensemble: Y = 2 * (2X + 1) + 1
    _ensemble(repo, "nested", [
        _step("chain", {"X": "X"}, {"Y": "c"}),
        _step("addone", {"X": "c"}, {"Y": "Y"}),
    ], fp32, {"Y": "TYPE_FP32"}, mbs=8)  # fmt: skip
    # big: identity twice, the tensor between them as large as the request's
    (repo / "big" / "1").mkdir(parents=True)
    (repo / "big" / "config.pbtxt").write_text(
        'name: "big"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "ensemble_scheduling { step [ "
        + _step("identity", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}) + ", "
        + _step("identity", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}) + " ] }\n"
    )  # fmt: skip
    # cached: chain with the response cache on the ensemble itself
    _ensemble(repo, "cached_chain", [
        _step("scale2", {"X": "X"}, {"Y": "t1"}),
        _step("addone", {"X": "t1"}, {"Y": "Y"}),
    ], fp32, {"Y": "TYPE_FP32"})  # fmt: skip
    with open(repo / "cached_chain" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    # cached_step: the second step's model caches, and its input is an intermediate in server memory
    _python(repo, "addone_cached", ADDONE, ["X"], ["Y"])
    with open(repo / "addone_cached" / "config.pbtxt", "a") as f:
        f.write("response_cache { enable: true }\n")
    _ensemble(repo, "cached_step", [
        _step("scale2", {"X": "X"}, {"Y": "t1"}),
        _step("addone_cached", {"X": "t1"}, {"Y": "Y"}),
    ], fp32, {"Y": "TYPE_FP32"})  # fmt: skip
    # fan_cached: two steps ready at once, the first a cached model that can answer synchronously
    _ensemble(repo, "fan_cached", [
        _step("addone_cached", {"X": "X"}, {"Y": "A"}),
        _step("scale2", {"X": "X"}, {"Y": "B"}),
        _step("sum2", {"A": "A", "B": "B"}, {"S": "S"}),
    ], fp32, {"S": "TYPE_FP32"})  # fmt: skip
    # grow: a step whose output outgrows the server's guess for it (1 value in, 200k out)
    (repo / "expand" / "1").mkdir(parents=True)
    (repo / "expand" / "config.pbtxt").write_text(
        'name: "expand"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    (repo / "expand" / "1" / "model.py").write_text(EXPAND)
    (repo / "grow" / "1").mkdir(parents=True)
    (repo / "grow" / "config.pbtxt").write_text(
        'name: "grow"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "ensemble_scheduling { step [ "
        + _step("expand", {"X": "X"}, {"Y": "wide"}) + ", "
        + _step("identity", {"INPUT0": "wide"}, {"OUTPUT0": "OUT"}) + " ] }\n"
    )  # fmt: skip
    # upper_tokens: a TYPE_STRING intermediate, a step output that is also an ensemble output, version 1
    (repo / "upper_tokens" / "1").mkdir(parents=True)
    (repo / "upper_tokens" / "config.pbtxt").write_text(
        'name: "upper_tokens"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "TOKENS" data_type: TYPE_INT32 dims: [ -1 ] },'
        ' { name: "WORDS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "ensemble_scheduling { step [ "
        + _step("text_upper", {"TEXT": "TEXT"}, {"UPPER": "upper", "TOKENS": "WORDS"}, version=1) + ", "
        + _step("tokenizer", {"TEXT": "upper"}, {"TOKENS": "TOKENS"}) + " ] }\n"
    )  # fmt: skip
    # load errors: each leaves only its own model unavailable
    _ensemble(repo, "bad_missing", [_step("no_such_model", {"X": "X"}, {"Y": "Y"})], fp32, {"Y": "TYPE_FP32"})
    _ensemble(repo, "bad_cycle", [
        _step("scale2", {"X": "b"}, {"Y": "a"}),
        _step("addone", {"X": "a"}, {"Y": "b"}),
        _step("scale2", {"X": "X"}, {"Y": "Y"}),
    ], fp32, {"Y": "TYPE_FP32"})  # fmt: skip
    _ensemble(repo, "bad_name", [_step("scale2", {"NOPE": "X"}, {"Y": "Y"})], fp32, {"Y": "TYPE_FP32"})
    _ensemble(
        repo, "bad_type", [_step("tokenizer", {"TEXT": "X"}, {"TOKENS": "Y"})], fp32, {"Y": "TYPE_FP32"}
    )
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> ServerProcess:
    from tests.conftest import start_server

    before = zinfer_segments()
    s = start_server(repo)
    yield s  # type: ignore[misc]
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)
    leaked = zinfer_segments() - before
    assert not leaked, f"segments left in /dev/shm: {sorted(leaked)}"


def _x(*rows: float) -> np.ndarray:
    return np.array([[v, v + 0.5, -v, 3 * v] for v in rows], np.float32)


def test_text_pipeline_runs_the_three_models(server: ServerProcess) -> None:
    texts = np.array([[b"Hello, World!"], [b"abc xyz"], [b""], ["\u00e9t\u00e9 Zz".encode()]], dtype=object)
    with Client(server.url) as c:
        out = c.infer("text_pipeline", {"TEXT": texts}).as_numpy("RESULT")
        assert out.shape == (4, 1)
        assert list(out.reshape(-1)) == [b"Uryyb, Jbeyq!", b"nop klm", b"", "\u00e9g\u00e9 Mm".encode()]
        # rot13 twice is the identity: feed the output back in
        again = c.infer("text_pipeline", {"TEXT": out}).as_numpy("RESULT")
        assert list(again.reshape(-1)) == list(texts.reshape(-1))


def test_chain_and_fanout_compute_the_dag(server: ServerProcess) -> None:
    x = _x(1, 2, 3)
    with Client(server.url) as c:
        np.testing.assert_array_equal(c.infer("chain", {"X": x}).as_numpy("Y"), 2 * (2 * x + 1))
        r = c.infer("fanout", {"X": x})
        np.testing.assert_array_equal(r.as_numpy("A"), 2 * x)
        np.testing.assert_array_equal(r.as_numpy("S"), 2 * x + x + 1)
        only_s = c.infer("fanout", {"X": x}, outputs=["S"])
        np.testing.assert_array_equal(only_s.as_numpy("S"), 3 * x + 1)
        np.testing.assert_array_equal(c.infer("nested", {"X": x}).as_numpy("Y"), 2 * (2 * x + 1) + 1)


def test_step_requests_join_the_step_models_batches(server: ServerProcess) -> None:
    """Concurrent ensemble requests and direct requests to a step model share that model's batches."""
    with Client(server.url) as c:
        before = c.statistics("scale2")["model_stats"][0]
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def worker(k: int) -> None:
        try:
            with Client(server.url) as c:
                x = _x(k)
                barrier.wait(timeout=30)
                if k % 2:
                    np.testing.assert_array_equal(c.infer("chain", {"X": x}).as_numpy("Y"), 2 * (2 * x + 1))
                else:
                    np.testing.assert_array_equal(c.infer("scale2", {"X": x}).as_numpy("Y"), 2 * x)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with Client(server.url) as c:
        after = c.statistics("scale2")["model_stats"][0]
    requests = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    batches = after["execution_count"] - before["execution_count"]
    assert requests == 8 + 2 * 8  # 8 direct, and two steps of each of 8 ensemble requests
    assert batches < requests, "step requests should have been batched with the others"


def test_a_failing_middle_step_names_the_step(server: ServerProcess) -> None:
    with Client(server.url) as c:
        with pytest.raises(ServerError) as info:
            c.infer("chain", {"X": _x(38)})  # 2 * 38.5 = 77
        text = str(info.value)
        assert "ensemble 'chain'" in text and "step 2 (model 'addone')" in text and "refuses 77" in text
        # nothing else is affected
        np.testing.assert_array_equal(c.infer("chain", {"X": _x(1)}).as_numpy("Y"), 2 * (2 * _x(1) + 1))
        with pytest.raises(ServerError, match=r"step 1 \(model 'chain'\).*step 2 \(model 'addone'\)"):
            c.infer("nested", {"X": _x(38)})


def test_bad_input_to_an_ensemble_is_refused_clearly(server: ServerProcess) -> None:
    with Client(server.url) as c:
        with pytest.raises(InvalidArgument, match="model 'chain'"):
            c.infer("chain", {"X": np.zeros((1, 4), np.float64)})
        with pytest.raises(InvalidArgument, match="chain"):
            c.infer("chain", {"X": np.zeros((1, 5), np.float32)})
        np.testing.assert_array_equal(c.infer("chain", {"X": _x(2)}).as_numpy("Y"), 2 * (2 * _x(2) + 1))


def test_intermediates_live_in_the_servers_shared_memory(server: ServerProcess) -> None:
    pid = server.proc.pid

    def server_segments() -> dict[str, int]:
        return {
            n: os.stat(f"/dev/shm/{n}").st_size
            for n in os.listdir("/dev/shm")
            if n.startswith(f"zinfer-s{pid}-")
        }

    x = np.random.default_rng(3).standard_normal((1, 6 << 20), dtype=np.float32)  # 24 MiB
    with Client(server.url) as c:
        out = c.infer("big", {"IN": x}).as_numpy("OUT")
        np.testing.assert_array_equal(out, x)
    segments = server_segments()
    assert segments, "the intermediate tensor should be in a server-owned segment"
    assert max(segments.values()) >= x.nbytes, segments  # the 24 MiB tensor between the steps lives there


def test_load_errors_leave_only_that_ensemble_unavailable(server: ServerProcess) -> None:
    with Client(server.url) as c:
        index = {row["name"]: row for row in c.repository_index()}
        assert index["chain"]["state"] == "READY"
        assert index["text_pipeline"]["state"] == "READY"
        reasons = {
            name: index[name]["reason"] for name in ("bad_missing", "bad_cycle", "bad_name", "bad_type")
        }
        assert all(index[n]["state"] == "UNAVAILABLE" for n in reasons)
        assert "no_such_model" in reasons["bad_missing"] and "no such model" in reasons["bad_missing"]
        assert "cycle" in reasons["bad_cycle"]
        assert "NOPE" in reasons["bad_name"]
        assert "TYPE_STRING" in reasons["bad_type"] and "TYPE_FP32" in reasons["bad_type"]
        with pytest.raises(Unavailable, match="bad_cycle"):
            c.infer("bad_cycle", {"X": _x(1)})


def test_cancelling_an_ensemble_request(server: ServerProcess) -> None:
    """A client timeout cancels the running step; the ensemble answers Cancelled and serves on."""
    with Client(server.url) as c:

        def failed() -> int:
            return int(c.statistics("chain")["model_stats"][0]["inference_stats"]["fail"]["count"])

        before = failed()
        with pytest.raises(RequestTimeout):
            c.infer("chain", {"X": _x(99.5)}, client_timeout=0.3)  # addone sleeps on 200 = 2 * 99.5 + 1

        def counted() -> bool:
            return failed() == before + 1

        wait_for(counted, 10, "the cancelled ensemble request to be counted")
        np.testing.assert_array_equal(c.infer("chain", {"X": _x(3)}).as_numpy("Y"), 2 * (2 * _x(3) + 1))


def test_statistics_and_metadata_of_an_ensemble(server: ServerProcess) -> None:
    with Client(server.url) as c:
        c.infer("fanout", {"X": _x(1)})
        meta = c.model_metadata("fanout")
        assert meta["platform"] == "ensemble"
        assert {t["name"] for t in meta["outputs"]} == {"S", "A"}
        stats = c.statistics("fanout")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] >= 1


def test_unloading_a_step_model_fails_the_ensemble_with_the_step_named(
    server_factory: Callable[..., ServerProcess], repo: Path
) -> None:
    loads = [a for m in ("text_pipeline", "tokenizer", "rot13", "detokenizer") for a in ("--load-model", m)]
    s = server_factory(repo, "--model-control-mode", "explicit", *loads)
    texts = np.array([[b"abc"]], dtype=object)
    with Client(s.url) as c:
        assert c.infer("text_pipeline", {"TEXT": texts}).as_numpy("RESULT")[0, 0] == b"nop"
        c.unload_model("rot13")
        with pytest.raises(Unavailable, match=r"step 2 \(model 'rot13'\)"):
            c.infer("text_pipeline", {"TEXT": texts})
        c.load_model("rot13")
        assert c.infer("text_pipeline", {"TEXT": texts}).as_numpy("RESULT")[0, 0] == b"nop"


def test_a_cached_ensemble_answers_repeats_without_running_its_steps(
    server_factory: Callable[..., ServerProcess], repo: Path
) -> None:
    s = server_factory(repo, "--cache-bytes", str(1 << 20))
    x = _x(5)
    with Client(s.url) as c:
        first = c.infer("cached_chain", {"X": x}).as_numpy("Y")
        runs = c.statistics("scale2")["model_stats"][0]["inference_stats"]["success"]["count"]
        for _ in range(3):
            again = c.infer("cached_chain", {"X": x}).as_numpy("Y")
            np.testing.assert_array_equal(again, first)
            assert again.tobytes() == (2 * x + 1).tobytes()
        stats = c.statistics("cached_chain")["model_stats"][0]["inference_stats"]
        assert stats["cache_hit"]["count"] == 3 and stats["cache_miss"]["count"] == 1
        assert c.statistics("scale2")["model_stats"][0]["inference_stats"]["success"]["count"] == runs


def test_a_cached_step_model_hits_on_an_intermediate_input(
    server_factory: Callable[..., ServerProcess], repo: Path
) -> None:
    s = server_factory(repo, "--cache-bytes", str(1 << 20))
    x = _x(6)
    with Client(s.url) as c:
        for _ in range(4):
            np.testing.assert_array_equal(c.infer("cached_step", {"X": x}).as_numpy("Y"), 2 * x + 1)
        stats = c.statistics("addone_cached")["model_stats"][0]
        assert stats["inference_stats"]["cache_hit"]["count"] == 3
        assert stats["inference_stats"]["cache_miss"]["count"] == 1
        assert stats["execution_count"] == 1


def test_a_step_output_larger_than_its_slot_is_moved_into_server_memory(server: ServerProcess) -> None:
    """``expand`` makes 800 KB from 4 bytes, over the server's guess: it comes back inline once and goes on
    to the next step from a slot of the right size."""
    x = np.array([[2.0], [3.0]], np.float32)
    with Client(server.url) as c:
        out = c.infer("grow", {"X": x}).as_numpy("OUT")
    np.testing.assert_array_equal(out, x * np.arange(200_000, dtype=np.float32))
    moved = [ln for ln in server.log().splitlines() if "event=intermediate_moved_to_server_memory" in ln]
    assert any("ensemble=grow" in line and f"bytes={2 * 200_000 * 4}" in line for line in moved), moved


def test_a_string_intermediate_and_a_pinned_step_version(server: ServerProcess) -> None:
    texts = np.array([[b"hello big world"], [b"x"]], dtype=object)
    with Client(server.url) as c:
        r = c.infer("upper_tokens", {"TEXT": texts})
    assert r.as_numpy("WORDS").tolist() == [[3], [1]]
    tokens = r.as_numpy("TOKENS")
    assert bytes((tokens[0] - 1).astype(np.uint8)) == b"HELLO BIG WORLD"
    assert tokens[1].tolist()[:2] == [ord("X") + 1, 0]


def test_a_step_answered_from_the_cache_does_not_start_its_siblings_twice(
    server_factory: Callable[..., ServerProcess], repo: Path
) -> None:
    s = server_factory(repo, "--cache-bytes", str(1 << 20))
    x = _x(4)
    with Client(s.url) as c:

        def scale2_runs() -> int:
            return int(c.statistics("scale2")["model_stats"][0]["inference_stats"]["success"]["count"])

        for k in range(3):
            before = scale2_runs()
            np.testing.assert_array_equal(c.infer("fan_cached", {"X": x}).as_numpy("S"), 3 * x + 1)
            assert scale2_runs() == before + 1, f"request {k}: scale2 ran {scale2_runs() - before} times"
        hits = c.statistics("addone_cached")["model_stats"][0]["inference_stats"]["cache_hit"]["count"]
        assert hits == 2
