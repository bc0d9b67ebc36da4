"""The host's figures under a Triton dashboard's names: CPU (always), GPU power (with NVML), pinned pool."""

from __future__ import annotations

import shutil
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from zinfer.broker.host_metrics import CpuMetrics, Nvml
from zinfer.broker.metrics import ServerMetrics

Times = namedtuple("Times", "user system idle iowait")
Memory = namedtuple("Memory", "total available")


def scrape(
    metrics: ServerMetrics,
) -> tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    types: dict[str, str] = {}
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return types, values


def test_cpu_figures_without_a_gpu() -> None:
    metrics = ServerMetrics(gpu=False, process=False)
    types, v = scrape(metrics)
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert types[name] == "gauge", name
    assert 0.0 <= v[("nv_cpu_utilization", frozenset())] <= 1.0
    total, used = v[("nv_cpu_memory_total_bytes", frozenset())], v[("nv_cpu_memory_used_bytes", frozenset())]
    assert 0 < used < total
    assert not any(name.startswith("nv_gpu_") for name in types)


def test_cpu_utilization_is_the_busy_share_between_scrapes() -> None:
    samples = iter([Times(10.0, 10.0, 80.0, 0.0), Times(40.0, 10.0, 90.0, 0.0), Times(40.0, 10.0, 90.0, 0.0)])
    cpu = CpuMetrics(cpu_times=lambda: next(samples), memory=lambda: Memory(1000, 250))
    assert cpu.utilization() == pytest.approx(0.2)  # since boot: 20 busy of 100
    assert cpu.utilization() == pytest.approx(0.75)  # then 30 busy of 40
    assert cpu.utilization() == 0.0  # no time passed: nothing to measure, not a division by zero
    families = {f.name: f.samples[0].value for f in CpuMetrics(memory=lambda: Memory(1000, 250)).collect()}
    assert families["nv_cpu_memory_total_bytes"] == 1000 and families["nv_cpu_memory_used_bytes"] == 750


def test_pinned_pool_series_say_no_pool_is_held() -> None:
    _, v = scrape(ServerMetrics(gpu=False, process=False))
    assert v[("nv_pinned_memory_pool_total_bytes", frozenset())] == 0
    assert v[("nv_pinned_memory_pool_used_bytes", frozenset())] == 0


FAKE_NVML = r"""
#include <stdio.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
static int dev[2];
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = &dev[i]; return 0; }
int nvmlDeviceGetUUID(void *h, char *buf, unsigned int len) {
    snprintf(buf, len, "GPU-fake-%d", (int)((int *)h - dev)); return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) { u->gpu = 10; u->memory = 1; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) { m->total = 4; m->used = 1; m->free = 3; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
    if (h == &dev[1]) return 3;  /* NVML_ERROR_NOT_SUPPORTED */
    *mw = 123456; return 0;
}
int nvmlDeviceGetPowerManagementLimit(void *h, unsigned int *mw) { *mw = 700000; return 0; }
int nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj) { *mj = 5000; return 0; }
"""


def test_gpu_power_through_a_fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build a fake libnvidia-ml")
    src, lib = tmp_path / "nvml.c", tmp_path / "libfake-nvml-power.so"
    src.write_text(FAKE_NVML)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    nvml = Nvml.load((str(lib),))
    assert nvml is not None
    monkeypatch.setattr(Nvml, "load", classmethod(lambda cls: nvml))
    metrics = ServerMetrics(process=False)
    types, v = scrape(metrics)
    text = metrics.render().decode()
    metrics.close()
    assert types["nv_gpu_power_usage"] == types["nv_gpu_power_limit"] == "gauge"
    assert v[("nv_gpu_power_usage", frozenset({("gpu_uuid", "GPU-fake-0")}))] == pytest.approx(123.456)
    assert ("nv_gpu_power_usage", frozenset({("gpu_uuid", "GPU-fake-1")})) not in v  # not supported: left out
    assert v[("nv_gpu_power_limit", frozenset({("gpu_uuid", "GPU-fake-1")}))] == 700.0
    assert v[("nv_energy_consumption_total", frozenset({("gpu_uuid", "GPU-fake-0")}))] == 5.0
    assert "# TYPE nv_energy_consumption counter\n" in text  # Triton's name, no _total
    assert v[("nv_cpu_memory_total_bytes", frozenset())] > 0  # the CPU figures sit beside them
