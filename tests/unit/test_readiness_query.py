"""A readiness query of a model with its own ``is_ready()``: ``Queries`` gets the call that asks its
instances through its constructor (``ReadinessWaits.ask``), and asks only once the model's instances have
reported that it has one (``ModelState.own_readiness``); nothing is wired into the model's state later."""

from __future__ import annotations

from pathlib import Path

from zinfer.broker.handlers import LATER, Queries
from zinfer.broker.model_state import ModelState
from zinfer.broker.registry import ModelRegistry
from zinfer.client.protocol import Command
from zinfer.modelconfig.model_config import parse_model_config

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _served() -> tuple[Queries, ModelState, list[tuple[ModelState, bytes, str]]]:
    config = parse_model_config(CONFIG, source="config.pbtxt", model_name="m")
    state = ModelState(config, 1, Path("/nonexistent/m/1"), 1)
    state.instances.add(b"w1")
    registry = ModelRegistry()
    registry.models["m"] = {1: state}
    asked: list[tuple[ModelState, bytes, str]] = []

    def ask(s: ModelState, client: bytes, request_id: str) -> None:
        asked.append((s, client, request_id))

    return Queries(registry, dict, list, lambda: True, ask), state, asked


def test_a_model_without_its_own_is_ready_is_answered_at_once() -> None:
    queries, state, asked = _served()
    assert not state.own_readiness
    assert queries.answer(Command.MODEL_READY, {"model": "m", "id": "q1"}, b"c") is True
    assert asked == []


def test_a_model_with_its_own_is_ready_asks_its_instances_and_answers_later() -> None:
    queries, state, asked = _served()
    state.own_readiness = True  # what the worker inbox records when an instance reports its answer
    assert queries.answer(Command.MODEL_READY, {"model": "m", "id": "q1"}, b"c") is LATER
    assert asked == [(state, b"c", "q1")]


def test_a_model_not_ready_is_not_asked_even_with_its_own_is_ready() -> None:
    queries, state, asked = _served()
    state.own_readiness = True
    state.error = "load failed"
    assert queries.answer(Command.MODEL_READY, {"model": "m"}, b"c") is False
    assert asked == []
