"""ServerMetrics: what the broker records comes back out of the exposition text, under Triton's names."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from zinfer.broker.host_metrics import Nvml
from zinfer.broker.metrics import (
    LATENCY_BUCKETS_US,
    CacheFigures,
    ServerMetrics,
    WorkerRecord,
    batch_buckets,
)

ADD = {"model": "add", "version": "1"}
ROOT = Path(__file__).resolve().parents[2]


def scrape(
    metrics: ServerMetrics,
) -> tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """(family name -> type, (sample name, labels) -> value) of one scrape."""
    types: dict[str, str] = {}
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return types, values


def value(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics(gpu=False, process=False)


def test_counters_equal_what_was_recorded(metrics: ServerMetrics) -> None:
    m = metrics.model("add", 1, max_batch_size=8)
    m.success(120.0, 30.0, 2, 5.0, 40.0, 6.0)
    m.success(80.0, 10.0, 3, 5.0, 40.0, 6.0)
    m.batch(5, "preferred", 30.0)
    m.bytes(100, 40)
    m.bytes(1, 2)
    m.pending(7)
    metrics.shm_bytes(1 << 20)
    types, v = scrape(metrics)
    assert value(v, "nv_inference_request_success_total", **ADD) == 2
    assert value(v, "nv_inference_count_total", **ADD) == 5
    assert value(v, "nv_inference_exec_count_total", **ADD) == 1
    assert value(v, "nv_inference_request_duration_us_total", **ADD) == 200
    assert value(v, "nv_inference_queue_duration_us_total", **ADD) == 40
    assert value(v, "nv_inference_compute_input_duration_us_total", **ADD) == 10
    assert value(v, "nv_inference_compute_infer_duration_us_total", **ADD) == 80
    assert value(v, "nv_inference_compute_output_duration_us_total", **ADD) == 12
    assert value(v, "zinfer_input_bytes_total", **ADD) == 101
    assert value(v, "zinfer_output_bytes_total", **ADD) == 42
    assert value(v, "nv_inference_pending_request_count", **ADD) == 7
    assert value(v, "zinfer_shm_mapped_bytes") == 1 << 20
    assert types["nv_inference_request_success"] == "counter"
    assert types["nv_inference_pending_request_count"] == "gauge"
    assert types["nv_inference_request_duration_histogram_us"] == "histogram"


def test_triton_counter_names_have_no_total_suffix(metrics: ServerMetrics) -> None:
    metrics.model("add", 1).success(1.0, 1.0, 1)
    text = metrics.render().decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="add",version="1"} 1.0\n' in text
    assert "# TYPE nv_inference_request_failure counter\n" in text
    assert "nv_inference_request_success_total" not in text
    assert "# TYPE zinfer_batch_reason_total counter\n" in text  # zinfer's own names keep _total
    assert "_created" not in text


def test_failures_are_labelled_with_tritons_reasons(metrics: ServerMetrics) -> None:
    m = metrics.model("add", 1)
    m.failure("BACKEND")
    m.failure("BACKEND")
    m.failure("no such reason")  # counted as OTHER
    m.rejected()
    m.timed_out()
    m.cancelled()
    _, v = scrape(metrics)

    def failed(reason: str) -> float:
        return value(v, "nv_inference_request_failure_total", **ADD, reason=reason)

    assert (failed("BACKEND"), failed("OTHER"), failed("REJECTED"), failed("CANCELED")) == (2, 1, 2, 1)
    assert value(v, "zinfer_requests_rejected_total", **ADD) == 1
    assert value(v, "zinfer_requests_timed_out_total", **ADD) == 1
    assert value(v, "zinfer_requests_cancelled_total", **ADD) == 1
    assert value(v, "nv_inference_request_success_total", **ADD) == 0


def test_latency_histograms_count_each_request_in_its_bucket(metrics: ServerMetrics) -> None:
    m = metrics.model("add", 1)
    for request_us in (40.0, 50.0, 51.0, 900.0, 2e7):
        m.success(request_us, 10.0, 1)
    _, v = scrape(metrics)
    name = "nv_inference_request_duration_histogram_us"

    def bucket(le: str) -> float:
        return value(v, name + "_bucket", **ADD, le=le)

    assert bucket("50.0") == 2  # le is inclusive
    assert bucket("100.0") == 3
    assert bucket("1000.0") == 4
    assert bucket(repr(LATENCY_BUCKETS_US[-1])) == 4
    assert bucket("+Inf") == 5
    assert value(v, name + "_count", **ADD) == 5
    assert value(v, name + "_sum", **ADD) == pytest.approx(40 + 50 + 51 + 900 + 2e7)
    assert value(v, "nv_inference_queue_duration_histogram_us_bucket", **ADD, le="50.0") == 5


def test_batch_size_histogram_reasons_and_delay(metrics: ServerMetrics) -> None:
    m = metrics.model("add", 1, max_batch_size=4)
    for size, reason in ((1, "idle_no_delay"), (4, "max_size"), (4, "max_size"), (3, "delay_expired")):
        m.batch(size, reason, 200.0)
    m.batch(2, "some_new_reason", 20.0)
    _, v = scrape(metrics)
    assert [
        value(v, "zinfer_batch_size_bucket", **ADD, le=le) for le in ("1.0", "2.0", "3.0", "4.0", "+Inf")
    ] == [
        1,
        2,
        3,
        5,
        5,
    ]
    assert value(v, "zinfer_batch_size_sum", **ADD) == 14
    assert value(v, "zinfer_batch_reason_total", **ADD, reason="max_size") == 2
    assert value(v, "zinfer_batch_reason_total", **ADD, reason="preferred") == 0
    assert value(v, "zinfer_batch_reason_total", **ADD, reason="some_new_reason") == 1
    assert value(v, "zinfer_queue_delay_us_count", **ADD) == 5
    assert value(v, "zinfer_queue_delay_us_bucket", **ADD, le="50.0") == 1
    assert value(v, "nv_inference_exec_count_total", **ADD) == 5


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [
        (0, (1,)),
        (1, (1,)),
        (4, (1, 2, 3, 4)),
        (40, (*range(1, 33), 40)),
        (256, (*range(1, 33), 64, 128, 256)),
        (300, (*range(1, 33), 64, 128, 256, 300)),
    ],
)
def test_batch_buckets(max_batch_size: int, expected: tuple[int, ...]) -> None:
    assert batch_buckets(max_batch_size) == expected


def test_models_are_bound_once_and_removed_on_unload(metrics: ServerMetrics) -> None:
    m = metrics.model("add", 1)
    assert metrics.model("add", 1) is m
    metrics.model("add", 2).success(1.0, 1.0, 1)
    m.remove()
    m.success(1.0, 1.0, 1)  # harmless after removal
    _, v = scrape(metrics)
    assert ("nv_inference_request_success_total", frozenset(ADD.items())) not in v
    assert value(v, "nv_inference_request_success_total", model="add", version="2") == 1
    assert metrics.model("add", 1) is not m  # a reload starts from zero


def test_worker_figures_from_the_records_callback() -> None:
    records = [
        WorkerRecord("add", 1, 0, os.getpid(), "cpu", "READY", 2),
        WorkerRecord("add", 1, 1, None, "gpu:0", "LOADING", 0),
        WorkerRecord("add", 1, 2, 2**22 + 12345, "cpu", "EXITED", 5),  # no such process
    ]
    metrics = ServerMetrics(lambda: records, gpu=False, process=False)
    _, v = scrape(metrics)
    me = {"model": "add", "version": "1", "model_instance": "0", "device": "cpu"}
    loading = {"model": "add", "version": "1", "model_instance": "1", "device": "gpu:0"}
    gone = {**me, "model_instance": "2"}
    assert value(v, "zinfer_worker_rss_bytes", **me) > 1 << 20
    assert value(v, "zinfer_worker_cpu_seconds_total", **me) > 0
    assert value(v, "zinfer_worker_restarts_total", **me) == 2
    assert value(v, "zinfer_worker_restarts_total", **gone) == 5
    assert [value(v, "zinfer_worker_up", **labels) for labels in (me, loading, gone)] == [1, 0, 0]
    assert ("zinfer_worker_rss_bytes", frozenset(loading.items())) not in v
    assert ("zinfer_worker_rss_bytes", frozenset(gone.items())) not in v


def test_a_failing_workers_callback_does_not_break_the_scrape() -> None:
    def broken() -> list[WorkerRecord]:
        raise RuntimeError("boom")

    metrics = ServerMetrics(broken, gpu=False, process=False)
    metrics.model("add", 1).success(1.0, 1.0, 1)
    _, v = scrape(metrics)
    assert value(v, "nv_inference_request_success_total", **ADD) == 1


def test_no_nvml_means_no_gpu_metrics_and_no_error() -> None:
    assert Nvml.load(("libzinfer-no-such-nvml.so",)) is None
    metrics = ServerMetrics(gpu=False)
    assert not metrics.gpu_enabled
    text = metrics.render().decode()
    assert "nv_gpu_" not in text
    assert "process_resident_memory_bytes" in text  # the broker's own process figures


def test_gpu_metrics_when_nvml_is_present() -> None:
    metrics = ServerMetrics()
    if not metrics.gpu_enabled:
        pytest.skip("no libnvidia-ml on this machine")
    types, v = scrape(metrics)
    metrics.close()
    assert types["nv_gpu_memory_used_bytes"] == "gauge"
    totals = [val for (name, _), val in v.items() if name == "nv_gpu_memory_total_bytes"]
    assert totals and all(t > 0 for t in totals)


FAKE_NVML = r"""
#include <stdio.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
static int inited = 0;
static int dev[2];
int nvmlInit_v2(void) { inited++; return INIT_RESULT; }
int nvmlShutdown(void) { inited--; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = &dev[i]; return 0; }
int nvmlDeviceGetUUID(void *h, char *buf, unsigned int len) {
    snprintf(buf, len, "GPU-fake-%d", (int)((int *)h - dev)); return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
    if (h == &dev[1]) return 3;  /* NVML_ERROR_NOT_SUPPORTED, as under MIG */
    u->gpu = 42; u->memory = 7; return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = 80ULL << 30; m->used = (unsigned long long)((int *)h - dev + 1) << 30;
    m->free = m->total - m->used; return 0;
}
int fake_inited(void) { return inited; }
"""


def fake_nvml(tmp_path: Path, init_result: int = 0) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build a fake libnvidia-ml")
    src, lib = tmp_path / "nvml.c", tmp_path / f"libfake-nvml-{init_result}.so"
    src.write_text(FAKE_NVML)
    subprocess.run(
        ["cc", "-shared", "-fPIC", f"-DINIT_RESULT={init_result}", "-o", str(lib), str(src)],
        check=True,
        timeout=60,
    )
    return lib


def test_gpu_metrics_through_a_fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = fake_nvml(tmp_path)
    nvml = Nvml.load((str(lib),))
    assert nvml is not None
    monkeypatch.setattr(Nvml, "load", classmethod(lambda cls: nvml))
    metrics = ServerMetrics(process=False)
    assert metrics.gpu_enabled
    types, v = scrape(metrics)
    assert types["nv_gpu_utilization"] == "gauge"
    assert value(v, "nv_gpu_utilization", gpu_uuid="GPU-fake-0") == 0.42
    assert ("nv_gpu_utilization", frozenset({("gpu_uuid", "GPU-fake-1")})) not in v  # not supported: left out
    assert value(v, "nv_gpu_memory_used_bytes", gpu_uuid="GPU-fake-1") == 2 << 30
    assert value(v, "nv_gpu_memory_total_bytes", gpu_uuid="GPU-fake-0") == 80 << 30
    metrics.close()
    assert not metrics.gpu_enabled
    assert ctypes.CDLL(str(lib)).fake_inited() == 0


def test_nvml_that_fails_to_initialise_gives_no_gpu_metrics(tmp_path: Path) -> None:
    assert Nvml.load((str(fake_nvml(tmp_path, init_result=9)),)) is None


def test_the_dashboard_only_queries_exported_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    dashboard = json.loads((ROOT / "configs" / "grafana-dashboard.json").read_text())
    assert any(v["type"] == "datasource" for v in dashboard["templating"]["list"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queried = {n for e in exprs for n in re.findall(r"\b(?:nv|zinfer|process)_\w+", e)}
    metrics = ServerMetrics(lambda: [WorkerRecord("add", 1, 0, os.getpid(), "cpu", "READY", 0)], gpu=False)
    metrics.model("add", 1)
    types, _ = scrape(metrics)
    exported = set(types) | {n + "_total" for n, t in types.items() if t == "counter"}
    exported |= {n + s for n, t in types.items() if t == "histogram" for s in ("_bucket", "_sum", "_count")}
    exported |= {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}  # with NVML
    assert queried and queried <= exported, queried - exported


def test_cache_series_only_for_models_that_use_the_cache(metrics: ServerMetrics) -> None:
    cached, plain = metrics.model("add", 1), metrics.model("identity", 1)
    _, v = scrape(metrics)
    assert not any(name.startswith(("nv_cache_", "zinfer_cache_")) for name, _ in v)  # nobody uses it
    cached.cache_enabled = True
    cached.cache_miss(30.0)
    cached.cache_insert(12.5)
    cached.cache_hit(4.0)
    cached.cache_hit(6.0)
    plain.cache_hit(1.0)  # not exported: the model does not use the cache
    metrics.cache(CacheFigures(used_bytes=640, capacity_bytes=4096, entries=2, evictions=3))
    types, v = scrape(metrics)
    assert value(v, "nv_cache_num_hits_per_model_total", **ADD) == 2
    assert value(v, "nv_cache_num_misses_per_model_total", **ADD) == 1
    assert value(v, "nv_cache_hit_duration_per_model_total", **ADD) == 10.0
    assert value(v, "nv_cache_miss_duration_per_model_total", **ADD) == 42.5
    assert not [k for k in v if dict(k[1]).get("model") == "identity" and k[0].startswith("nv_cache_")]
    assert types["nv_cache_num_hits_per_model"] == "counter"
    assert (value(v, "zinfer_cache_used_bytes"), value(v, "zinfer_cache_capacity_bytes")) == (640, 4096)
    assert value(v, "zinfer_cache_entries") == 2
    assert value(v, "zinfer_cache_evictions_total") == 3
    text = metrics.render().decode()
    assert "# TYPE nv_cache_num_hits_per_model counter\n" in text  # Triton's name, no _total
    assert 'nv_cache_num_hits_per_model{model="add",version="1"} 2.0\n' in text
    metrics.cache(None)
    _, v = scrape(metrics)
    assert not any(name.startswith("zinfer_cache_") for name, _ in v)
