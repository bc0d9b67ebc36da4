"""Implicit sequence state in the worker: initial values, rows kept per sequence, END, capacity, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zinfer.client.errors import ConfigError, InternalError
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config
from zinfer.workers.batch_io import BatchRequest
from zinfer.workers.sequence_state import ImplicitStates, state_specs


def config(state: str, mbs: int = 4) -> ModelConfig:
    text = (f'name: "m"\nbackend: "python"\nmax_batch_size: {mbs}\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f"sequence_batching {{ state [ {{ {state} }} ] }}\n")  # fmt: skip
    return parse_model_config(text, source="m/config.pbtxt", model_name="m")


def req(sid: int, start: bool = False, end: bool = False) -> BatchRequest:
    return BatchRequest(sid, (), (), sequence={"id": sid, "start": start, "end": end})


S = 'input_name: "SI" output_name: "SO" data_type: TYPE_INT32 dims: [ 2 ]'


def test_rows_are_kept_per_sequence_and_end_drops_them(tmp_path: Path) -> None:
    states = ImplicitStates(state_specs(config(S), tmp_path), batching=True)
    batch = [req(1, start=True), req(2, start=True)]
    first = states.inputs(batch)["SI"]
    assert first.shape == (2, 2) and not first.any()  # zeros of dims
    states.update(batch, {"SO": np.array([[1, 1], [2, 2]], np.int32)})
    assert states.inputs([req(2), req(1)])["SI"].tolist() == [[2, 2], [1, 1]]
    states.update([req(1, end=True)], {"SO": np.array([[9, 9]], np.int32)})
    assert len(states) == 1
    assert states.inputs([req(1)])["SI"].tolist() == [[0, 0]]  # forgotten: back to the initial state
    assert states.inputs([req(2, start=True)])["SI"].tolist() == [[0, 0]]  # START resets


def test_capacity_drops_the_least_recently_used(tmp_path: Path) -> None:
    states = ImplicitStates(state_specs(config(S), tmp_path), batching=True, capacity=2)
    for sid in (1, 2, 3):
        states.update([req(sid)], {"SO": np.full((1, 2), sid, np.int32)})
    assert len(states) == 2
    assert states.inputs([req(1), req(3)])["SI"].tolist() == [[0, 0], [3, 3]]


def test_bad_state_outputs_keep_nothing(tmp_path: Path) -> None:
    states = ImplicitStates(state_specs(config(S), tmp_path), batching=True)
    with pytest.raises(InternalError, match="no state output 'SO'"):
        states.update([req(1)], {})
    with pytest.raises(InternalError, match="one row per request"):
        states.update([req(1), req(2)], {"SO": np.zeros((1, 2), np.int32)})
    with pytest.raises(InternalError, match="is float32"):
        states.update([req(1)], {"SO": np.zeros((1, 2), np.float32)})
    assert len(states) == 0


def test_growing_state_starts_empty_and_unbatched_models_get_no_batch_dim(tmp_path: Path) -> None:
    grow = 'input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ -1 ]'
    states = ImplicitStates(state_specs(config(grow, mbs=0), tmp_path), batching=False)
    assert states.inputs([req(1, start=True)])["SI"].shape == (0,)
    states.update([req(1)], {"SO": np.arange(3, dtype=np.float32)})
    assert states.inputs([req(1)])["SI"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ('input_name: "X" output_name: "SO" data_type: TYPE_FP32 dims: [ 1 ]', "also a config input"),
        ('input_name: "SI" output_name: "SO" data_type: TYPE_STRING dims: [ 1 ]', "TYPE_STRING"),
        (
            'input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 1 ] initial_state { '
            'data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" }',
            "initial_state is TYPE_INT32",
        ),  # fmt: skip
        (
            'input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 2 ] initial_state { '
            'data_type: TYPE_FP32 dims: [ 2 ] data_file: "s.bin" name: "f" }',
            "holds 4 bytes",
        ),  # fmt: skip
        (
            'input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 2 ] initial_state { '
            'data_type: TYPE_FP32 dims: [ 2 ] data_file: "none.bin" name: "f" }',
            "none.bin",
        ),  # fmt: skip
    ],
)
def test_bad_state_configs_fail_the_load(tmp_path: Path, state: str, message: str) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.float32([1]).tobytes())
    with pytest.raises(ConfigError, match=message):
        state_specs(config(state), tmp_path)


def test_initial_state_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.float32([1, 2]).tobytes())
    state = ('input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 2 ] initial_state { '
             'data_type: TYPE_FP32 dims: [ 2 ] data_file: "s.bin" name: "f" }')  # fmt: skip
    states = ImplicitStates(state_specs(config(state), tmp_path), batching=True)
    assert states.inputs([req(5, start=True)])["SI"].tolist() == [[1.0, 2.0]]
