"""The GPUs a broker can place instances on, found without importing CuPy into the broker.

A GPU is usable when a worker could use it: CuPy imports and the CUDA runtime counts it. The broker asks
a short-lived ``python -c`` child (with a timeout) once and remembers the answer; the child inherits the
environment, so ``CUDA_VISIBLE_DEVICES`` is honoured and the indices it gives are the ones a worker's
``--device gpu:N`` means. Where CuPy is not installed, or ``CUDA_VISIBLE_DEVICES`` hides every device,
no child is started at all.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0
DEVICE_ENV = "ZINFER_DEVICE"  # tells a worker its CUDA_VISIBLE_DEVICES was narrowed to its GPU

_PROBE = (
    "import json, cupy\n"
    "n = int(cupy.cuda.runtime.getDeviceCount())\n"
    "names = []\n"
    "for i in range(n):\n"
    "    p = cupy.cuda.runtime.getDeviceProperties(i)\n"
    "    name = p.get('name', b'')\n"
    "    names.append(name.decode(errors='replace') if isinstance(name, bytes) else str(name))\n"
    "print(json.dumps({'count': n, 'names': names}))\n"
)


@dataclass(frozen=True)
class GpuProbe:
    """The usable GPUs by index, their names, and why there are none (empty when there are some)."""

    ids: tuple[int, ...]
    names: tuple[str, ...] = ()
    reason: str = ""


def _hidden_by_env() -> bool:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles")


def probe_gpus(timeout: float = PROBE_TIMEOUT_S) -> GpuProbe:
    """Ask a child process what CuPy sees; never raises."""
    if _hidden_by_env():
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        return GpuProbe((), reason=f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
    if importlib.util.find_spec("cupy") is None:
        hint = "pip install 'zinfer[gpu-cuda12]' or 'zinfer[gpu-cuda13]'"
        return GpuProbe((), reason=f"CuPy is not installed ({hint})")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return GpuProbe((), reason=f"asking CuPy for devices took over {timeout:g}s")
    except OSError as exc:
        return GpuProbe((), reason=f"cannot start the GPU probe: {exc.strerror or exc}")
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        return GpuProbe((), reason=f"CuPy cannot use CUDA: {last}")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        count, names = int(found["count"]), tuple(str(n) for n in found["names"])
    except (ValueError, KeyError, IndexError, TypeError):
        return GpuProbe((), reason=f"the GPU probe answered {done.stdout.strip()[:200]!r}")
    if count == 0:
        return GpuProbe((), reason="CUDA reports no device")
    return GpuProbe(tuple(range(count)), names)


@functools.cache
def gpu_probe() -> GpuProbe:
    """:func:`probe_gpus`, once per process."""
    probe = probe_gpus()
    if probe.ids:
        log.info("event=gpus_found count=%d names=%s", len(probe.ids), ",".join(probe.names))
    else:
        log.info("event=no_gpu reason=%r", probe.reason)
    return probe


def gpu_ids() -> list[int]:
    """The indices of the usable GPUs (cached after the first call)."""
    return list(gpu_probe().ids)


def worker_environment(device: str, environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment of a worker for ``device``, or None to inherit the server's as it is.

    A ``gpu:N`` worker sees only that GPU: ``CUDA_VISIBLE_DEVICES`` is the N-th entry of the server's own
    (an index, a ``GPU-``/``MIG-`` UUID), or ``N`` where the server has none, and ``ZINFER_DEVICE`` says
    so, so the worker uses CUDA device 0 under its own number. CuPy's current device is per thread, so
    without this a model's threads and libraries such as torch would default to GPU 0 and make a context
    there. An index past the server's list is left alone (the worker's load reports it)."""
    if not device.startswith("gpu:") or not device[4:].isdigit():
        return None
    index = int(device[4:])
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        narrowed = str(index)
    else:
        entries = [e.strip() for e in visible.split(",")]
        if index >= len(entries) or not entries[index]:
            return None
        narrowed = entries[index]
    return {**environ, "CUDA_VISIBLE_DEVICES": narrowed, DEVICE_ENV: device}
