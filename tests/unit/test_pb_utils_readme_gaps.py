"""APIs of Triton's python_backend README that docs/models.md's table did not list: each refused by name
or shown to work (issue 16, point 1, checked against the README section by section)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.modelconfig.repository import load_model_entry
from zinfer.workers import triton_python_backend_utils as pb_utils


def test_unload_dependents_is_refused_by_name() -> None:
    # Triton unloads the models that depend on it too; zinfer cannot, so it says so instead of ignoring it
    with pytest.raises(pb_utils.TritonModelException, match=r"unload_dependents=True\) is not supported"):
        pb_utils.unload_model("m", unload_dependents=True)


def test_force_cpu_only_input_tensors_no_loads(tmp_path: Path) -> None:
    # "no" lets Triton hand inputs in CPU or GPU memory; zinfer's are on the host, which that mode allows
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    )
    (model_dir / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters: { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'
    )
    entry = load_model_entry(model_dir)
    assert entry.error is None, entry.error
    assert entry.config is not None and entry.config.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"
