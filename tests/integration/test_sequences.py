"""Sequence batching over a real server: routing and order (correct running sums from interleaved
sequences), END and idle release, and both strategies."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ServerProcess, start_server, wait_for
from zinfer.client import Client
from zinfer.client.errors import InvalidArgument

DIRECT = "running_sum"
OLDEST = "running_sum_oldest"
IDLE = "running_sum_idle"


def _variant(repo: Path, name: str, old: str, new: str) -> None:
    shutil.copytree(MODELS / DIRECT, repo / name)
    config = repo / name / "config.pbtxt"
    text = config.read_text().replace(f'name: "{DIRECT}"', f'name: "{name}"')
    assert old in text
    config.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    _variant(repo, DIRECT, "count: 1", "count: 2")
    _variant(
        repo,
        OLDEST,
        "direct { }",
        "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }",
    )
    _variant(repo, IDLE, "max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 200000")
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)


def _x(v: float) -> np.ndarray:
    return np.array([[v]], np.float32)


def _step(
    client: Client, model: str, sid: int | str, v: float, start: bool = False, end: bool = False
) -> float:
    r = client.infer(model, {"X": _x(v)}, sequence_id=sid, sequence_start=start, sequence_end=end)
    return float(r.as_numpy("SUM").reshape(-1)[0])


@pytest.mark.parametrize("model", [DIRECT, OLDEST])
def test_interleaved_sequences_get_their_own_running_sums(server: ServerProcess, model: str) -> None:
    steps = 12
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def run(sid: int) -> None:
        try:
            with Client(server.url, timeout=30) as client:
                out = []
                for i in range(steps):
                    out.append(_step(client, model, sid, float(sid), start=i == 0, end=i == steps - 1))
                results[sid] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(sid,)) for sid in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for sid, out in results.items():
        assert out == [float(sid) * (i + 1) for i in range(steps)], (sid, out)
    assert len(results) == 6


def test_pipelined_requests_of_one_sequence_run_in_order(server: ServerProcess) -> None:
    """Several requests of one sequence in flight at once still run one at a time, in arrival order."""
    with Client(server.url, timeout=30) as client:
        assert _step(client, DIRECT, 77, 1.0, start=True) == 1.0
    sums: list[float] = []
    lock = threading.Lock()

    def one(v: float) -> None:
        with Client(server.url, timeout=30) as c:
            s = _step(c, DIRECT, 77, v)
            with lock:
                sums.append(s)

    threads = [threading.Thread(target=one, args=(1.0,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(sums) == [float(n) for n in range(2, 10)]  # each saw every earlier one exactly once


def test_start_resets(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as client:
        assert _step(client, DIRECT, 77, 2.0, start=True) == 2.0
        assert _step(client, DIRECT, 77, 3.0, start=True) == 3.0  # a new START starts over
        assert _step(client, DIRECT, 77, 1.0, end=True) == 4.0


def test_string_ids_are_refused_where_the_model_keys_its_state_on_a_numeric_corrid(
    server: ServerProcess,
) -> None:
    """running_sum keeps a sum per CORRID, a TYPE_UINT64: two string sequences would both be given 0 and
    share one sum. So a string id is an error that says what to change; string ids work with a TYPE_STRING
    CORRID (test_frontdoor_sequence_quickstart.py) or with none (test_bls_options.py)."""
    with Client(server.url, timeout=30) as client:
        for sid in ("abc", "xyz"):
            with pytest.raises(
                InvalidArgument, match=f"sequence '{sid}' to model '{DIRECT}': a string sequence_id"
            ):
                _step(client, DIRECT, sid, 2.0, start=True)
        assert _step(client, DIRECT, 78, 2.0, start=True) == 2.0  # nothing of the refused ones is left
        assert _step(client, DIRECT, 78, 1.0, end=True) == 3.0


def test_end_then_request_without_start_fails(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as client:
        assert _step(client, DIRECT, 500, 1.0, start=True) == 1.0
        assert _step(client, DIRECT, 500, 1.0, end=True) == 2.0
        text = f"inference request for sequence 500 to model '{DIRECT}' must specify the START flag"
        with pytest.raises(InvalidArgument, match=text + " on the first request of the sequence"):
            _step(client, DIRECT, 500, 1.0)
        with pytest.raises(InvalidArgument, match="sequence 501 to model .* must specify the START flag"):
            _step(client, DIRECT, 501, 1.0)
        with pytest.raises(InvalidArgument, match="sequence_id"):
            client.infer(DIRECT, {"X": _x(1.0)})


def test_idle_sequences_are_released(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as client:
        assert _step(client, IDLE, 9, 1.0, start=True) == 1.0
        assert _step(client, IDLE, 9, 1.0) == 2.0
        # the broker releases it once idle for 200 ms, and says so; wait for that, not for a fixed time
        released = f"event=sequences_released model={IDLE} reason=idle"
        wait_for(lambda: released in server.log(), 10, "the idle sequence's release")
        with pytest.raises(InvalidArgument, match="sequence 9 to model .* must specify the START flag"):
            _step(client, IDLE, 9, 1.0)
        assert _step(client, IDLE, 9, 5.0, start=True) == 5.0


def test_models_without_sequence_batching_ignore_the_parameters(server: ServerProcess) -> None:
    del server  # the bundled "add" model runs on a server of its own below
    s = start_server()
    try:
        with Client(s.url, timeout=30) as client:
            a = np.array([[1.0]], np.float32)
            r = client.infer("add", {"INPUT_A": a, "INPUT_B": a}, sequence_id=3, sequence_start=True)
            assert r.as_numpy("OUTPUT_SUM").tolist() == [[2.0]]
            # the bundled running_sum works too
            assert _step(client, DIRECT, 1, 4.0, start=True) == 4.0
    finally:
        assert s.stop() == 0
        shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
        s.log_path.unlink(missing_ok=True)
