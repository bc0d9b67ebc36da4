"""Run a model's ``model_warmup`` samples at load, before the worker says READY (Triton's warmup).

A sample is ``batch_size`` requests of one row (``zinfer.modelconfig.warmup.request_arrays``), run ``count``
times (once when 0): a whole-batch model gets them gathered into one batch on its device, a request-by-request
model (Triton python) as separate requests. Outputs are dropped; nothing is counted in the statistics. A
sample whose run raises, or whose request comes back with an error, fails the load with a ConfigError naming
the sample, so the model is not served half-warmed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from zinfer.client.errors import ConfigError, ServerError
from zinfer.modelconfig.model_config import ModelConfig
from zinfer.modelconfig.warmup import request_arrays

from .device import CPU, Device
from .model import AnyModel, RequestInputs, RequestModel

__all__ = ["run_warmup"]

log = logging.getLogger(__name__)


def run_warmup(config: ModelConfig, model: AnyModel, model_dir: Path, device: Device = CPU) -> None:
    rng = np.random.default_rng()
    for sample in config.model_warmup:
        start = time.perf_counter()
        requests = [request_arrays(config, sample, model_dir, rng) for _ in range(sample.batch_size)]
        try:
            for _ in range(max(1, sample.count)):
                if isinstance(model, RequestModel):
                    wanted = tuple(t.name for t in config.output)
                    results = model.execute_requests(
                        [RequestInputs(f"warmup-{sample.name}", dict(r), wanted) for r in requests]
                    )
                    failed = next((r for r in results if isinstance(r, ServerError)), None)
                    if failed is not None:
                        raise failed
                else:
                    names = requests[0].keys()
                    model.execute({n: device.batch([r[n] for r in requests]) for n in names})
                device.synchronize()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"model '{config.name}': model_warmup '{sample.name}' failed: {type(exc).__name__}: {exc}"
            ) from None
        log.info(
            "event=warmup_done model=%s sample=%s runs=%d ms=%.1f",
            config.name, sample.name, max(1, sample.count), (time.perf_counter() - start) * 1e3,
        )  # fmt: skip
