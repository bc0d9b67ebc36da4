"""A repository of many tiny models for on-demand model control: ``scale_K`` answers ``Y = K * X``, so any
answer tells which model computed it (tests and ``bench/bench_many_models.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONFIG = """name: "{name}"
backend: "zinfer"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ {batching} }}
instance_group [ {{ kind: {kind} count: 1 }} ]
parameters [
  {{ key: "kernel" value: {{ string_value: "linear" }} }}{extra}
]
"""

PINNED = ',\n  { key: "zinfer_pinned" value: { string_value: "true" } }'


def scale_name(k: int) -> str:
    return f"scale_{k}"


def write_scale_model(
    repo: Path, k: int, pinned: bool = False, kind: str = "KIND_CPU", hold_us: int = 0, prefix: str = "scale"
) -> str:
    """``scale_K``: a linear layer whose 1x1 weight is K. ``hold_us``: a request waits that long in the
    queue for a batch of 8 (the model is in use all that time)."""
    name = f"{prefix}_{k}"
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    batching = f"preferred_batch_size: [ 8 ] max_queue_delay_microseconds: {hold_us}" if hold_us else ""
    (repo / name / "config.pbtxt").write_text(
        CONFIG.format(name=name, kind=kind, extra=PINNED if pinned else "", batching=batching)
    )
    np.save(version / "W.npy", np.full((1, 1), k, np.float32))
    return name


def write_scale_repo(
    repo: Path, count: int, pinned: tuple[int, ...] = (), kind: str = "KIND_CPU"
) -> list[str]:
    """``scale_1`` .. ``scale_<count>``; those numbered in ``pinned`` carry ``zinfer_pinned``."""
    return [write_scale_model(repo, k, k in pinned, kind) for k in range(1, count + 1)]


def write_ensemble(repo: Path, name: str, steps: tuple[str, str]) -> str:
    """An ensemble ``Y = steps[1](steps[0](X))`` of two scale models."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(f"""name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "{steps[0]}" model_version: -1
      input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "mid" }} }},
    {{ model_name: "{steps[1]}" model_version: -1
      input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "Y" }} }}
  ]
}}
""")
    return name


BLS = """
from zinfer.workers import bls


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        return {"Y": bls.infer("%s", {"X": inputs["X"]})["Y"] + 1}
"""


def write_bls_model(repo: Path, name: str, target: str) -> str:
    """A native python model answering ``target(X) + 1`` through a BLS call."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    (repo / name / "1" / "model.py").write_text(BLS % target)
    return name
