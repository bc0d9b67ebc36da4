"""The Triton model repository ``bench_vs_triton.py`` serves with both Triton and zinfer, written into a
temp dir: the same ``config.pbtxt`` and ``model.py`` files for both servers.

* ``add``: a ``TritonPythonModel`` add, max_batch_size 64, preferred [16, 32, 64], delay 500 µs;
* ``big``: a ``TritonPythonModel`` passing 4 MiB of FP32 through (in and out), max_batch_size 8;
* ``text_ensemble``: a seed-style LLM text pipeline of three ``TritonPythonModel`` steps: ``tokenizer`` and
  ``detokenizer`` without ``dynamic_batching``, 2 CPU instances each; ``lm`` (ROT13 on tokens) batched with
  preferred [4, 8, 16], delay 5 ms, 2 instances;
* zinfer's repository adds ``add0``: the built-in add kernel with delay 0 (zinfer's own limit, which Triton
  cannot load).
"""

from __future__ import annotations

from pathlib import Path

BIG_ELEMENTS = 1 << 20  # 4 MiB of FP32
TEXT = b"The quick brown fox jumps over the lazy dog, 42 times."
EXPECTED = b"Gur dhvpx oebja sbk whzcf bire gur ynml qbt, 42 gvzrf."

_ADD_CONFIG = """name: "add"
backend: "python"
max_batch_size: 64
input [
  { name: "INPUT_A" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "INPUT_B" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [ { name: "OUTPUT_SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching {
  preferred_batch_size: [ 16, 32, 64 ]
  max_queue_delay_microseconds: 500
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_ADD_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT_A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT_B").as_numpy()
            out = pb_utils.Tensor("OUTPUT_SUM", a + b)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

_BIG_CONFIG = f"""name: "big"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {BIG_ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {BIG_ELEMENTS} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_BIG_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def _step_config(name: str, inp: tuple[str, str, str], out: tuple[str, str, str], batching: str) -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "{inp[0]}" data_type: {inp[1]} dims: [ {inp[2]} ] }} ]
output [ {{ name: "{out[0]}" data_type: {out[1]} dims: [ {out[2]} ] }} ]
{batching}instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""


_TOKENIZER_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            rows = [np.frombuffer(bytes(t), np.uint8).astype(np.int32) + 1 for t in texts]
            tokens = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
            for i, r in enumerate(rows):
                tokens[i, : len(r)] = r
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOKENS", tokens)]))
        return responses
"""

_LM_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils

_TABLE = np.arange(257, dtype=np.int32)
for _c in range(26):
    _TABLE[ord("a") + _c + 1] = ord("a") + (_c + 13) % 26 + 1
    _TABLE[ord("A") + _c + 1] = ord("A") + (_c + 13) % 26 + 1


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()
            out = _TABLE[np.clip(tokens, 0, 256)]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOKENS_OUT", out)]))
        return responses
"""

_DETOKENIZER_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()
            texts = [bytes((row[row > 0] - 1).astype(np.uint8)) for row in tokens]
            out = np.array(texts, dtype=object).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", out)]))
        return responses
"""

_ENSEMBLE_CONFIG = """name: "text_ensemble"
platform: "ensemble"
max_batch_size: 16
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "tokenizer" model_version: -1
      input_map { key: "TEXT" value: "TEXT" } output_map { key: "TOKENS" value: "tokens" } },
    { model_name: "lm" model_version: -1
      input_map { key: "TOKENS" value: "tokens" } output_map { key: "TOKENS_OUT" value: "rotated" } },
    { model_name: "detokenizer" model_version: -1
      input_map { key: "TOKENS" value: "rotated" } output_map { key: "TEXT" value: "RESULT" } }
  ]
}
"""

_ADD0_CONFIG = """name: "add0"
backend: "zinfer"
max_batch_size: 64
input [
  { name: "INPUT_A" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "INPUT_B" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [ { name: "OUTPUT_SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 0 }
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "kernel" value: { string_value: "add" } }
"""


def _model(root: Path, name: str, config: str, code: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    if code is not None:
        (root / name / "1" / "model.py").write_text(code)


def write(root: Path, zinfer_only: bool) -> Path:
    """The repository under ``root``; ``zinfer_only`` adds ``add0``. Returns ``root``."""
    batched = (
        "dynamic_batching {\n  preferred_batch_size: [ 4, 8, 16 ]\n  max_queue_delay_microseconds: 5000\n}\n"
    )
    _model(root, "add", _ADD_CONFIG, _ADD_MODEL)
    _model(root, "big", _BIG_CONFIG, _BIG_MODEL)
    tokens = ("TOKENS", "TYPE_INT32", "-1")
    text = ("TEXT", "TYPE_STRING", "1")
    _model(root, "tokenizer", _step_config("tokenizer", text, tokens, ""), _TOKENIZER_MODEL)
    lm_out = ("TOKENS_OUT", "TYPE_INT32", "-1")
    _model(root, "lm", _step_config("lm", tokens, lm_out, batched), _LM_MODEL)
    _model(root, "detokenizer", _step_config("detokenizer", tokens, text, ""), _DETOKENIZER_MODEL)
    _model(root, "text_ensemble", _ENSEMBLE_CONFIG, None)
    if zinfer_only:
        _model(root, "add0", _ADD0_CONFIG, None)
    return root
