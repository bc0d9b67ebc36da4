"""A model's load generation that retires (replaced by a reload, or unloaded) leaves the rate limiter once
its queue has drained and its workers have stopped: the turns the limiter keeps per generation do not
pile up across reloads (``ModelControl`` calls ``RateLimiter.forget_model``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zinfer.broker.batching.batcher import DynamicBatcher, QueuedRequest
from zinfer.broker.batching.rate_limiter import RateLimiter
from zinfer.broker.instance_pool import InstancePool
from zinfer.broker.limited_dispatch import ModelKey, model_key
from zinfer.broker.metrics import ServerMetrics
from zinfer.broker.model_control import ModelControl
from zinfer.broker.model_state import ModelState
from zinfer.broker.outbox import Outbox
from zinfer.broker.registry import ModelRegistry
from zinfer.broker.scheduler import Batching
from zinfer.broker.server_options import ServerOptions
from zinfer.modelconfig.model_config import parse_model_config

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def state(generation: int) -> ModelState:
    config = parse_model_config(CONFIG, source="config.pbtxt", model_name="m")
    s = ModelState(config, 1, Path("/nonexistent/m/1"), 1)
    s.generation = generation
    s.metrics = ServerMetrics(gpu=False, process=False).model("m", 1, 4)
    return s


def old_batcher(s: ModelState) -> DynamicBatcher[Any]:
    assert isinstance(s.scheduler, Batching)
    return s.scheduler.batcher  # type: ignore[return-value]  # its items here are plain values


def control(tmp_path: Path) -> tuple[ModelControl, ModelRegistry, RateLimiter[bytes, ModelKey]]:
    registry = ModelRegistry()
    limiter: RateLimiter[bytes, ModelKey] = RateLimiter()
    options = ServerOptions(tmp_path, tmp_path, model_control_mode="explicit")
    mc = ModelControl(
        options, registry, InstancePool(5.0), Outbox(), lambda _: None, lambda _s, _d: None, limiter
    )
    return mc, registry, limiter


def test_a_reloaded_models_old_generation_is_dropped_from_the_limiter_once_drained(tmp_path: Path) -> None:
    mc, registry, limiter = control(tmp_path)
    old, new = state(1), state(2)
    registry.install("m", [old])
    limiter.served(model_key(old))
    old_batcher(old).add(QueuedRequest(item=object(), batch_size=1, shape_key="a", arrival=0.0), 0.0)
    registry.install("m", [new])  # the reload: the old generation retires
    limiter.served(model_key(new))

    mc.poll(0.0)  # still a request queued: the old generation is not gone yet
    assert registry.retiring == [old]
    assert limiter.models() == {model_key(old), model_key(new)}

    old_batcher(old).remove(lambda _: True)
    mc.poll(0.0)
    assert registry.retiring == []
    assert limiter.models() == {model_key(new)}


def test_an_unloaded_models_generation_is_dropped_from_the_limiter(tmp_path: Path) -> None:
    mc, registry, limiter = control(tmp_path)
    s = state(1)
    registry.install("m", [s])
    limiter.served(model_key(s))
    mc.unload("m")
    mc.poll(0.0)
    assert registry.retiring == []
    assert limiter.models() == set()
