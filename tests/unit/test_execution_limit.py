"""The per-model execution limit (parameter execution_timeout_ms) and busy instances: parsing, the
deadline check with an injected clock, and the busy gauges."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from zinfer.broker.execution_limit import busy_since, overdue
from zinfer.broker.metrics import ServerMetrics, WorkerRecord
from zinfer.broker.model_state import InFlight, ModelState
from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.modelconfig.parameters import execution_limit_ns
from zinfer.modelconfig.repository import load_model_entry

MS = 1_000_000

BASE = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def config(limit: str | None) -> ModelConfig:
    text = BASE
    if limit is not None:
        text += f'parameters {{ key: "execution_timeout_ms" value: {{ string_value: "{limit}" }} }}\n'
    return parse_model_config(text, source="config.pbtxt", model_name="m")


def state(limit: str | None) -> ModelState:
    return ModelState(config(limit), 1, Path("/nonexistent/m/1"), 2)


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, None), ("250", 250 * MS), (" 5000 ", 5000 * MS), ("1", MS)]
)
def test_valid_limits(raw: str | None, expected: int | None) -> None:
    assert execution_limit_ns(config(raw)) == expected


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "abc", "", "1e3", "٣", "9" * 13])
def test_invalid_limits_are_config_errors_naming_the_parameter(raw: str) -> None:
    with pytest.raises(
        ConfigError, match=r"model 'm': parameter execution_timeout_ms must be a positive whole"
    ):
        execution_limit_ns(config(raw))


def test_an_invalid_limit_fails_the_models_load_with_the_reason(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        BASE + 'parameters { key: "execution_timeout_ms" value: { string_value: "soon" } }\n'
    )
    entry = load_model_entry(model)
    assert entry.error is not None and "execution_timeout_ms" in entry.error and "'soon'" in entry.error
    (model / "config.pbtxt").write_text(
        BASE + 'parameters { key: "execution_timeout_ms" value: { string_value: "300" } }\n'
    )
    assert load_model_entry(model).error is None


def test_only_batches_past_their_models_limit_are_overdue() -> None:
    limited, unlimited = state("300"), state(None)
    a = InFlight(1, b"m/1/0", limited, [], sent_ns=1_000 * MS)
    b = InFlight(2, b"m/1/1", limited, [], sent_ns=1_200 * MS)
    c = InFlight(3, b"n/1/0", unlimited, [], sent_ns=0)
    batches = [a, b, c]
    assert overdue(batches, 1_300 * MS) == []
    assert overdue(batches, 1_300 * MS + 1) == [a]  # strictly past the limit
    assert overdue(batches, 1_500 * MS + 1) == [a, b]
    assert c not in overdue(batches, 10**15)  # no limit: never overdue, however long


def test_a_prefetching_worker_is_judged_by_the_batch_it_runs() -> None:
    """A worker holding two batches (GPU look-ahead) runs the older one: only that one is overdue."""
    limited = state("100")
    running = InFlight(1, b"m/1/0", limited, [], sent_ns=0)
    staged = InFlight(2, b"m/1/0", limited, [], sent_ns=50 * MS)
    assert overdue([staged, running], 200 * MS) == [running]
    assert busy_since([staged, running]) == {b"m/1/0": 0}
    assert overdue([staged], 200 * MS) == [staged]  # once the first is gone, the second's clock runs


def test_busy_since_lists_busy_workers_only() -> None:
    s = state(None)
    assert busy_since([]) == {}
    assert busy_since([InFlight(1, b"w0", s, [], 7), InFlight(2, b"w1", s, [], 9)]) == {b"w0": 7, b"w1": 9}


def _samples(metrics: ServerMetrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name.startswith("zinfer_worker_busy"):
                out[(sample.name, sample.labels["model_instance"])] = sample.value
    return out


def test_busy_gauges_grow_with_the_clock() -> None:
    now = [10_000 * MS]
    records = [
        WorkerRecord("m", 1, 0, None, "cpu", "READY", 0, busy_since_ns=7_500 * MS),
        WorkerRecord("m", 1, 1, None, "cpu", "READY", 0),
    ]
    metrics = ServerMetrics(lambda: records, gpu=False, process=False, clock_ns=lambda: now[0])
    first = _samples(metrics)
    assert first[("zinfer_worker_busy", "0")] == 1 and first[("zinfer_worker_busy", "1")] == 0
    assert first[("zinfer_worker_busy_seconds", "0")] == pytest.approx(2.5)
    assert first[("zinfer_worker_busy_seconds", "1")] == 0
    now[0] += 4_000 * MS
    assert _samples(metrics)[("zinfer_worker_busy_seconds", "0")] == pytest.approx(6.5)
