"""The response cache and the rate limiter on a real server: ``zinfer serve`` with ``--cache-bytes`` and
``--rate-limit-resource``, its workers real processes, the client the real ``Client`` over the ipc socket.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all
from zinfer.broker.response_cache import ENTRY_OVERHEAD, TENSOR_OVERHEAD
from zinfer.client import Client
from zinfer.client.errors import ServerError, Unavailable

pytestmark = pytest.mark.integration

BIG = 2048  # floats per row of the "big" requests: 8 KiB, through shared memory both ways
ENTRY_BIG = ENTRY_OVERHEAD + 2 * TENSOR_OVERHEAD + 2 * BIG * 4  # a cached response with both outputs
CACHE_BYTES = 4 * ENTRY_BIG + 2000  # room for four big responses (and a few small ones)

DOUBLER = """
    import numpy as np

    class Model:
        def execute(self, inputs):
            x = inputs["X"]
            if (x == 9).any():
                raise ValueError("nine is not a number I like")
            return {"Y": x * 2 + 1, "Z": -x}
"""

RECORDER = """
    import os
    import time

    class Model:
        def initialize(self, config):
            self.log = config["parameters"]["log"]["string_value"]
            self.name = config["name"]

        def execute(self, inputs):
            start = time.monotonic()
            time.sleep(0.02)
            end = time.monotonic()
            with open(self.log, "a") as f:
                f.write(f"{self.name} {os.getpid()} {start:.6f} {end:.6f}\\n")
            return {"Y": inputs["X"] + 1}
"""


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}\n')
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def _doubler_config(rows: int, cache: bool) -> str:
    return (
        f"max_batch_size: 8\n"
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {rows} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {rows} ] }},\n'
        f'         {{ name: "Z" data_type: TYPE_FP32 dims: [ {rows} ] }} ]\n'
        f"response_cache {{ enable: {'true' if cache else 'false'} }}"
    )


def _recorder_config(log: Path, limiter: str, count: int = 2) -> str:
    return (
        "max_batch_size: 4\n"
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: {count} {limiter} }} ]\n"
        f'parameters {{ key: "log" value: {{ string_value: "{log}" }} }}'
    )


# ------------------------------------------------------------------------------------------ cache


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _model(repo, "small", _doubler_config(4, cache=True), DOUBLER)
    _model(repo, "big", _doubler_config(BIG, cache=True), DOUBLER)
    _model(repo, "uncached", _doubler_config(4, cache=False), DOUBLER)
    server = start_server(repo, "--cache-bytes", str(CACHE_BYTES))
    yield server
    stop_all([server])


@pytest.fixture(scope="module")
def client(cached: ServerProcess) -> Iterator[Client]:
    with Client(cached.url, timeout=30) as c:
        yield c


def _stats(client: Client, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.statistics(model)["model_stats"][0]
    return stats


def _counts(client: Client, model: str) -> tuple[int, int, int]:
    """(execution_count, cache hits, cache misses)"""
    s = _stats(client, model)
    inf = s["inference_stats"]
    return s["execution_count"], inf["cache_hit"]["count"], inf["cache_miss"]["count"]


def _check(client: Client, model: str, x: np.ndarray, outputs: list[str] | None = None) -> None:
    result = client.infer(model, {"X": x}, outputs=outputs)
    for name in outputs or ["Y", "Z"]:
        expected = x * 2 + 1 if name == "Y" else -x
        got = result.as_numpy(name)
        assert got.dtype == np.float32 and got.shape == x.shape
        assert got.tobytes() == expected.tobytes(), name  # bit-exact
    assert result.output_names == (outputs or ["Y", "Z"])


@pytest.mark.parametrize("model", ["small", "big"])  # inline tensors, and shared memory both ways
def test_a_repeated_request_is_answered_from_the_cache_without_a_worker(client: Client, model: str) -> None:
    rows = 4 if model == "small" else BIG
    x = np.random.default_rng(1).standard_normal((2, rows)).astype(np.float32)
    execs, hits, misses = _counts(client, model)
    _check(client, model, x)
    assert _counts(client, model) == (execs + 1, hits, misses + 1)
    for _ in range(3):
        _check(client, model, x.copy())  # the same values in another array: the same key
    assert _counts(client, model) == (execs + 1, hits + 3, misses + 1)
    stats = _stats(client, model)
    assert (
        stats["inference_stats"]["cache_hit"]["ns"] > 0 and stats["inference_stats"]["cache_miss"]["ns"] > 0
    )
    assert stats["inference_stats"]["success"]["count"] >= 4  # hits are successes
    x2 = x.copy()
    x2[1, 0] += 1.0
    _check(client, model, x2)  # one value differs: a miss
    assert _counts(client, model) == (execs + 2, hits + 3, misses + 2)


def test_requested_outputs_are_part_of_the_key(client: Client) -> None:
    x = np.random.default_rng(2).standard_normal((1, 4)).astype(np.float32)
    execs, hits, misses = _counts(client, "small")
    _check(client, "small", x, ["Y"])
    _check(client, "small", x, ["Z"])
    _check(client, "small", x, ["Y"])
    _check(client, "small", x, ["Z", "Y"])
    assert _counts(client, "small") == (execs + 3, hits + 1, misses + 3)


def test_a_model_without_the_cache_always_runs(client: Client) -> None:
    x = np.ones((1, 4), np.float32)
    execs, _, _ = _counts(client, "uncached")
    for _ in range(3):
        _check(client, "uncached", x)
    assert _counts(client, "uncached") == (execs + 3, 0, 0)


def test_errors_are_never_cached(client: Client) -> None:
    x = np.full((1, 4), 9, np.float32)  # the model raises
    execs, hits, misses = _counts(client, "small")
    for _ in range(2):
        with pytest.raises(ServerError, match="nine"):
            client.infer("small", {"X": x})
    assert _counts(client, "small") == (execs + 2, hits, misses + 2)


def test_least_recently_used_responses_are_evicted_from_a_small_cache(client: Client) -> None:
    rng = np.random.default_rng(3)
    a, b, c, d, e = (rng.standard_normal((1, BIG)).astype(np.float32) for _ in range(5))
    for x in (a, b, c, d):
        _check(client, "big", x)
    execs, hits, misses = _counts(client, "big")
    _check(client, "big", a)  # a is now the most recently used: b is the oldest
    assert _counts(client, "big") == (execs, hits + 1, misses)
    _check(client, "big", e)  # no room for five: b goes
    for x in (a, c, d, e):
        _check(client, "big", x)
    assert _counts(client, "big") == (execs + 1, hits + 5, misses + 1)
    _check(client, "big", b)
    assert _counts(client, "big") == (execs + 2, hits + 5, misses + 2)


def test_a_response_larger_than_the_cache_is_not_stored(client: Client) -> None:
    x = np.arange(8 * BIG, dtype=np.float32).reshape(8, BIG) + 0.5  # 128 KiB of outputs
    execs, hits, misses = _counts(client, "big")
    _check(client, "big", x)
    _check(client, "big", x)
    assert _counts(client, "big") == (execs + 2, hits, misses + 2)


def test_concurrent_identical_requests_all_get_the_right_answer(client: Client) -> None:
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _check(client, "small", x), range(32)))


# ------------------------------------------------------------------------------------------ rate limiter


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repo = tmp_path_factory.mktemp("repo")
    log = repo / "executions.log"
    shared = "rate_limiter { resources [ { name: 'ONE' global: true count: 1 } ] }"
    _model(repo, "first", _recorder_config(log, shared), RECORDER)
    _model(repo, "second", _recorder_config(log, shared + " ", count=2), RECORDER)
    greedy = "rate_limiter { resources [ { name: 'ONE' global: true count: 2 } ] }"
    _model(repo, "greedy", _recorder_config(log, greedy, count=1), RECORDER)
    server = start_server(repo, "--rate-limit-resource", "ONE:1")
    yield server, log
    stop_all([server])


def _executions(log: Path) -> list[tuple[str, int, float, float]]:
    rows = []
    for line in log.read_text().splitlines():
        name, pid, start, end = line.split()
        rows.append((name, int(pid), float(start), float(end)))
    return sorted(rows, key=lambda r: r[2])


def test_a_resource_of_one_is_never_held_twice(limited: tuple[ServerProcess, Path]) -> None:
    running, log = limited
    log.unlink(missing_ok=True)

    def call(i: int) -> None:
        with Client(running.url, timeout=30) as c:
            model = "first" if i % 2 else "second"
            for j in range(6):
                x = np.full((1, 1), i * 100 + j, np.float32)
                assert c.infer(model, {"X": x}).as_numpy("Y")[0, 0] == i * 100 + j + 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(8)))
    runs = _executions(log)
    assert len(runs) >= 8  # requests that queued together may share a batch
    assert {r[0] for r in runs} == {"first", "second"}
    assert len({r[1] for r in runs}) >= 3  # the two instances of each model both worked
    for before, after in zip(runs, runs[1:], strict=False):
        assert after[2] >= before[3], f"{before} overlaps {after}"
    # the models took turns: neither ran everything first
    switches = sum(1 for x, y in zip(runs, runs[1:], strict=False) if x[0] != y[0])
    assert switches >= len(runs) // 4, [r[0] for r in runs]
    # all given back: each model alone, then both at once, still runs at once (a leaked unit would hold
    # every later request until its client's timeout)
    with Client(running.url, timeout=5) as c, ThreadPoolExecutor(2) as pool:
        for model in ("first", "second"):
            assert c.infer(model, {"X": np.ones((1, 1), np.float32)}).as_numpy("Y")[0, 0] == 2

        def once(model: str) -> float:
            with Client(running.url, timeout=5) as own:
                return float(own.infer(model, {"X": np.zeros((1, 1), np.float32)}).as_numpy("Y")[0, 0])

        assert list(pool.map(once, ["first", "second"])) == [1.0, 1.0]


def test_an_instance_needing_more_than_the_server_has_fails_its_model(
    limited: tuple[ServerProcess, Path],
) -> None:
    running, _ = limited
    with Client(running.url, timeout=30) as c:
        with pytest.raises(Unavailable, match="rate limiter.*'ONE'"):
            c.infer("greedy", {"X": np.ones((1, 1), np.float32)})
        with pytest.raises(Unavailable, match="rate limiter"):
            c.infer("greedy", {"X": np.ones((1, 1), np.float32)})
        assert not c.is_model_ready("greedy")
        assert c.is_model_ready("first")
