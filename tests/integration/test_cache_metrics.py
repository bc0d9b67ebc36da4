"""The response cache's Prometheus series over a real ``zinfer serve --cache-bytes``: Triton's
``nv_cache_*_per_model`` for the models that use the cache (and for no other), agreeing with the
statistics call, and zinfer's ``zinfer_cache_*`` figures of the cache itself."""

from __future__ import annotations

import shutil
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerProcess, start_server, wait_for
from zinfer.client import Client

pytestmark = pytest.mark.integration

CACHE_BYTES = 1 << 20
N = 6  # identical requests: one miss, N - 1 hits

MODEL = """
    class Model:
        def execute(self, inputs):
            return {"Y": inputs["X"] * 2 + 1}
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _model(repo: Path, name: str, cache: bool) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        f"response_cache {{ enable: {'true' if cache else 'false'} }}\n"
    )
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODEL))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    _model(path, "cached", cache=True)
    _model(path, "plain", cache=False)
    return path


def _stop(server: ServerProcess) -> None:
    assert server.stop() == 0, server.log()
    shutil.rmtree(server.runtime_dir.parent, ignore_errors=True)
    server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    s = start_server(repo, "--cache-bytes", str(CACHE_BYTES))
    yield s
    _stop(s)


def _samples(server: ServerProcess) -> Samples:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name.removesuffix("_total"), tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _cache_series(samples: Samples, model: str) -> list[str]:
    return [n for n, labels in samples if n.startswith("nv_cache_") and ("model", model) in labels]


def _infer(client: Client, model: str, x: np.ndarray) -> None:
    y = client.infer(model, {"X": x}).as_numpy("Y")
    assert y.tobytes() == (x * 2 + 1).tobytes()


def _stats(client: Client, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.statistics(model)["model_stats"][0]
    return stats


def test_identical_requests_are_one_miss_and_then_hits(server: ServerProcess) -> None:
    cached = {"model": "cached", "version": "1"}
    before = _samples(server)
    assert _value(before, "nv_cache_num_hits_per_model", **cached) == 0  # exported from the start
    assert _value(before, "nv_cache_num_misses_per_model", **cached) == 0
    x = np.array([[1.5, -2.0, 3.25]], np.float32)
    with Client(server.url, timeout=30) as client:
        for _ in range(N):
            _infer(client, "cached", x.copy())
        stats = _stats(client, "cached")
    m = _samples(server)
    assert _value(m, "nv_cache_num_misses_per_model", **cached) == 1
    assert _value(m, "nv_cache_num_hits_per_model", **cached) == N - 1
    hit_us = _value(m, "nv_cache_hit_duration_per_model", **cached)
    miss_us = _value(m, "nv_cache_miss_duration_per_model", **cached)
    assert hit_us is not None and miss_us is not None and hit_us > 0 and miss_us > 0
    # the same figures as the statistics call (which counts nanoseconds)
    inf = stats["inference_stats"]
    assert (inf["cache_hit"]["count"], inf["cache_miss"]["count"]) == (N - 1, 1)
    assert hit_us == pytest.approx(inf["cache_hit"]["ns"] / 1000, abs=0.01)
    assert miss_us == pytest.approx(inf["cache_miss"]["ns"] / 1000, abs=0.01)
    # hits are successes, but only the miss ran the model (Triton's nv_inference_count excludes hits)
    assert _value(m, "nv_inference_request_success", **cached) == N
    assert _value(m, "nv_inference_count", **cached) == 1
    assert _value(m, "nv_inference_exec_count", **cached) == 1


def test_a_model_without_the_cache_has_no_cache_series(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as client:
        for _ in range(3):
            _infer(client, "plain", np.ones((1, 3), np.float32))
        inf = _stats(client, "plain")["inference_stats"]
    assert inf["cache_hit"]["count"] == inf["cache_miss"]["count"] == 0
    m = _samples(server)
    assert _value(m, "nv_inference_exec_count", model="plain", version="1") == 3
    assert _cache_series(m, "plain") == []
    assert len(_cache_series(m, "cached")) == 4


def test_the_cache_figures(server: ServerProcess) -> None:
    with Client(server.url, timeout=30) as client:
        for v in range(3):
            _infer(client, "cached", np.full((1, 3), 100 + v, np.float32))
            _infer(client, "plain", np.full((1, 3), 100 + v, np.float32))  # never stored
        entries = _stats(client, "cached")["inference_stats"]["cache_miss"]["count"]  # one per miss
    got: dict[str, float | None] = {}

    def published() -> bool:  # the broker publishes its figures every 0.25 s
        m = _samples(server)
        got.update({n: _value(m, f"zinfer_cache_{n}") for n in ("entries", "used_bytes", "capacity_bytes")})
        got["evictions"] = _value(m, "zinfer_cache_evictions")
        return got["entries"] == entries

    wait_for(published, 10, f"zinfer_cache_entries to reach {entries}")
    assert got["capacity_bytes"] == CACHE_BYTES
    used = got["used_bytes"]
    assert used is not None and 0 < used <= CACHE_BYTES
    assert got["evictions"] == 0


def test_a_server_without_a_cache_exports_no_cache_series(
    repo: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    s = server_factory(repo)  # "cached" asks for the cache, the server has none
    with Client(s.url, timeout=30) as client:
        for _ in range(2):
            _infer(client, "cached", np.ones((1, 3), np.float32))
    m = _samples(s)
    assert _value(m, "nv_inference_exec_count", model="cached", version="1") == 2
    assert not [n for n, _ in m if n.startswith(("nv_cache_", "zinfer_cache_"))]
