"""Measured memory of model instances, for on-demand model control's budgets (``on_demand``).

An instance's ``host`` footprint is its worker process's RSS (psutil); a GPU instance adds the device memory
its worker reported in its last heartbeat (``device_bytes``, CuPy's pool on its device) under ``gpuN``.
Only ready instances are measured: one still loading is counted by its model's estimate instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from .memory_budget import HOST, device_memory
from .model_state import ModelState

if TYPE_CHECKING:
    from .instance_pool import InstancePool
    from .supervisor import Supervisor, WorkerProc

__all__ = ["FootprintProbe"]


class FootprintProbe:
    def __init__(self, pool: InstancePool, supervisor: Supervisor, device_bytes: dict[bytes, int]) -> None:
        self.pool = pool
        self.supervisor = supervisor
        self.device_bytes = device_bytes  # the workers' last reports (``WorkerInbox.device_bytes``)
        self.per_instance: dict[str, int] = {}  # the mean instance measured so far: host, and gpu

    def models(self, models: Iterable[tuple[str, Iterable[ModelState]]]) -> dict[str, dict[str, int]]:
        """Each model's footprint now (ready instances only); updates the mean instance, and forgets the
        reports of workers that are gone."""
        procs = self._procs()
        out: dict[str, dict[str, int]] = {}
        host: list[int] = []
        gpu: list[int] = []
        for name, states in models:
            fp: dict[str, int] = {}
            for state in states:
                for identity in self.pool.workers_of(state):
                    wp = procs.get(identity)
                    if wp is not None and identity in state.instances:
                        self._add(fp, identity, wp, host, gpu)
            out[name] = fp
        for gone in self.device_bytes.keys() - procs.keys():
            del self.device_bytes[gone]
        if host:
            self.per_instance[HOST] = sum(host) // len(host)
        if gpu:
            self.per_instance["gpu"] = sum(gpu) // len(gpu)
        return out

    def states(self, states: Iterable[ModelState]) -> dict[str, int]:
        """Memory the workers of ``states`` hold now, loading or not (unloaded models not gone yet)."""
        procs = self._procs()
        out: dict[str, int] = {}
        for state in states:
            for identity in self.pool.workers_of(state):
                wp = procs.get(identity)
                if wp is not None:
                    self._add(out, identity, wp, [], [])
        return out

    def _procs(self) -> dict[bytes, WorkerProc]:
        return {wp.identity: wp for wp in self.supervisor.procs()}

    def _add(
        self, fp: dict[str, int], identity: bytes, wp: WorkerProc, host: list[int], gpu: list[int]
    ) -> None:
        rss = _rss(wp.proc.pid)
        fp[HOST] = fp.get(HOST, 0) + rss
        host.append(rss)
        memory = device_memory(wp.spec.device)
        if memory != HOST:
            used = self.device_bytes.get(identity)
            if used is None:  # no heartbeat since it became ready: the mean instance until it reports
                used = self.per_instance.get("gpu", 0)
            else:
                gpu.append(used)
            fp[memory] = fp.get(memory, 0) + used


def _rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0
