"""The short-lived process that runs a model's ``auto_complete_config`` with a ``pb_utils.ModelConfig``
(``zinfer.workers.pb_model_config``).

Run as ``python -m zinfer.workers.auto_complete <model.py> <model name> <version>`` by
``zinfer.modelconfig.python_autocomplete``: it reads the config as JSON on stdin, imports the model file as
the worker would, calls ``auto_complete_config`` and writes ``{"config": ...}`` (or ``{"error": ...}``) as
JSON on stdout. What the model prints goes to stderr, so it cannot mix with the answer.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from zinfer.modelconfig.model_config import ModelConfig as ParsedConfig

from .pb_model_config import ModelConfig
from .python_model import describe, find_model_class, import_model_file, where_in

__all__ = ["ModelConfig", "auto_complete", "main"]


def auto_complete(path: Path, name: str, version: str, config: dict[str, Any]) -> dict[str, Any]:
    """The config ``path``'s model completes (unchanged when its class has no ``auto_complete_config``)."""

    module = import_model_file(path, ParsedConfig(name=name), version)
    cls, _ = find_model_class(module, path)
    hook = getattr(cls, "auto_complete_config", None)
    if hook is None:
        return config
    given = ModelConfig(config)
    try:
        returned = hook(given)
    except Exception as exc:
        raise ValueError(f"auto_complete_config raised {describe(exc)}{where_in(path, exc)}") from None
    if not isinstance(returned, ModelConfig):
        raise ValueError(
            f"auto_complete_config returned {type(returned).__name__}: "
            "it must return the ModelConfig it was given"
        )
    return returned.as_dict()


def main() -> int:
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # the model's prints go to stderr, never into the answer
    sys.stdout = sys.stderr
    try:
        path, name, version = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
        config = json.loads(sys.stdin.buffer.read(16 << 20))
        answer: dict[str, Any] = {"config": auto_complete(path, name, version, config)}
    except Exception as exc:  # noqa: BLE001 - every failure becomes the answer's error text
        answer = {"error": str(exc) or type(exc).__name__}
    try:
        text = json.dumps(answer)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"error": f"the completed config cannot be written as JSON: {exc}"})
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
