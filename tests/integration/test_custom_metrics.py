"""A Triton python model's pb_utils.MetricFamily series reach /metrics beside the built-in ones."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerProcess, wait_for
from zinfer.client import Client

pytestmark = pytest.mark.integration

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        done = pb_utils.MetricFamily(
            name="rows_seen", description="Rows this model saw", kind=pb_utils.MetricFamily.COUNTER
        )
        self.rows = done.Metric(labels={"route": "main"})
        self.size = pb_utils.MetricFamily(
            name="row_value", description="Values seen", kind=pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels={}, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.rows.increment(float(x.shape[0]))
            for v in x.reshape(-1):
                self.size.observe(float(v))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _samples(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_custom_metrics_are_exported_with_model_and_version(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    folder = tmp_path / "repo" / "counted"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    server = server_factory(tmp_path / "repo", "--heartbeat-interval", "0.2")
    with Client(server.url, timeout=30) as client:
        client.infer("counted", {"X": np.array([[0.5], [5.0], [50.0]], np.float32)})
        client.infer("counted", {"X": np.array([[2.0]], np.float32)})
    mv = {("model", "counted"), ("version", "1")}
    rows = ("rows_seen_total", frozenset(mv | {("route", "main")}))  # the parser adds _total
    wait_for(lambda: _samples(server).get(rows) == 4.0, 20, "the custom counter to reach /metrics")
    samples = _samples(server)
    assert samples[("row_value_bucket", frozenset(mv | {("le", "1.0")}))] == 1
    assert samples[("row_value_bucket", frozenset(mv | {("le", "10.0")}))] == 3
    assert samples[("row_value_count", frozenset(mv))] == 4
    assert samples[("nv_inference_request_success_total", frozenset(mv))] == 2  # beside the built-in ones
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
        assert "# TYPE rows_seen counter\n" in reply.read().decode()  # the model's name, as Triton exports it
