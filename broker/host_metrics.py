"""The host's own figures on the metrics endpoint, under the names a Triton dashboard queries.

* **CPU** (``nv_cpu_utilization``, ``nv_cpu_memory_total_bytes``, ``nv_cpu_memory_used_bytes``; gauges, no
  labels) through psutil, always. Utilization is the busy share of all CPUs between two scrapes (since boot
  at the first), in [0.0, 1.0]; used memory is total minus available, as Triton reads ``/proc/meminfo``.
* **GPU** (``nv_gpu_utilization``, ``nv_gpu_memory_{total,used}_bytes``, ``nv_gpu_power_usage`` and
  ``nv_gpu_power_limit`` in watts, ``nv_energy_consumption`` in joules; label ``gpu_uuid``) through
  libnvidia-ml loaded with ctypes, only when it loads and sees a device; otherwise there are no ``nv_gpu_``
  series at all and the rest works as before. A query a device does not support leaves its series out.
* **Pinned memory pool** (``nv_pinned_memory_pool_total_bytes``, ``nv_pinned_memory_pool_used_bytes``): 0.
  Triton copies through a pool of page-locked host memory it allocates at start; zinfer has no such pool
  (GPU workers page-lock the clients' shared-memory regions in place, see ``workers/gpu.py``), so the
  series exist, for dashboards that query them, and say that no pool is held.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

__all__ = ["ENERGY", "CpuMetrics", "Nvml", "pinned_pool_families"]

log = logging.getLogger(__name__)

ENERGY = "nv_energy_consumption"  # a counter under Triton's name, without _total


class CpuMetrics:
    """``nv_cpu_*`` at each scrape. ``cpu_times`` and ``memory`` are psutil's, injectable for tests."""

    def __init__(
        self,
        cpu_times: Callable[[], Any] = psutil.cpu_times,
        memory: Callable[[], Any] = psutil.virtual_memory,
    ) -> None:
        self._cpu_times = cpu_times
        self._memory = memory
        self._last: tuple[float, float] = (0.0, 0.0)  # (busy, total) seconds at the previous scrape

    def utilization(self) -> float:
        times = self._cpu_times()
        total = float(sum(times))
        idle = float(times.idle + getattr(times, "iowait", 0.0))
        busy = total - idle
        last_busy, last_total = self._last
        self._last = (busy, total)
        span = total - last_total
        if span <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy - last_busy) / span))

    def collect(self) -> Iterator[Metric]:
        try:
            rate = self.utilization()
            mem = self._memory()
        except (psutil.Error, OSError):  # never fail a scrape on a host figure
            log.warning("event=cpu_metrics_failed", exc_info=True)
            return
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", rate)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", mem.total)
        yield GaugeMetricFamily(
            "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", mem.total - mem.available
        )


def pinned_pool_families() -> Iterator[Metric]:
    """Triton's pinned-memory pool gauges: zinfer holds no pool (see the module docstring)."""
    yield GaugeMetricFamily(
        "nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes", 0
    )
    yield GaugeMetricFamily(
        "nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes", 0
    )


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """GPU figures through libnvidia-ml, loaded with ctypes (no NVIDIA Python package needed)."""

    def __init__(self, lib: ctypes.CDLL, devices: list[tuple[str, ctypes.c_void_p]]) -> None:
        self._lib = lib
        self._devices = devices

    @classmethod
    def load(cls, names: Sequence[str] = ("libnvidia-ml.so.1", "libnvidia-ml.so")) -> Nvml | None:
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                if lib.nvmlInit_v2() != 0:
                    return None
                count = ctypes.c_uint(0)
                if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                    lib.nvmlShutdown()
                    return None
                devices = []
                for i in range(count.value):
                    handle, uuid = ctypes.c_void_p(), ctypes.create_string_buffer(96)
                    if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                        continue
                    ok = lib.nvmlDeviceGetUUID(handle, uuid, 96) == 0
                    devices.append((uuid.value.decode() if ok else f"gpu{i}", handle))
                log.debug("event=nvml_loaded devices=%d", len(devices))
                return cls(lib, devices)
            except (OSError, AttributeError):
                continue
        return None

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily(
            "nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0]", labels=["gpu_uuid"]
        )
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory", labels=["gpu_uuid"])
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory", labels=["gpu_uuid"])
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=["gpu_uuid"])
        limit = GaugeMetricFamily(
            "nv_gpu_power_limit", "GPU power management limit in watts", labels=["gpu_uuid"]
        )
        energy = Metric(ENERGY, "GPU energy consumption in joules since the driver loaded", "counter")
        for uuid, handle in self._devices:
            rates, mem = _Utilization(), _Memory()
            if self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0:
                util.add_metric([uuid], rates.gpu / 100.0)  # not supported under MIG: left out
            if self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0:
                used.add_metric([uuid], float(mem.used))
                total.add_metric([uuid], float(mem.total))
            milli = ctypes.c_uint(0)
            if self._call("nvmlDeviceGetPowerUsage", handle, ctypes.byref(milli)):
                power.add_metric([uuid], milli.value / 1000.0)  # NVML reports milliwatts
            if self._call("nvmlDeviceGetPowerManagementLimit", handle, ctypes.byref(milli)):
                limit.add_metric([uuid], milli.value / 1000.0)
            millijoules = ctypes.c_ulonglong(0)
            if self._call("nvmlDeviceGetTotalEnergyConsumption", handle, ctypes.byref(millijoules)):
                energy.add_sample(ENERGY, {"gpu_uuid": uuid}, millijoules.value / 1000.0)
        yield from (util, used, total, power, limit, energy)

    def _call(self, name: str, *args: object) -> bool:
        """An NVML query that a device or driver may lack: False when it is missing or not supported
        (a GPU without power readings, under MIG, an older libnvidia-ml), and the series is left out."""
        fn = getattr(self._lib, name, None)  # ctypes raises AttributeError for a symbol it cannot find
        return fn is not None and fn(*args) == 0

    def shutdown(self) -> None:
        self._lib.nvmlShutdown()
