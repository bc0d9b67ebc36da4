"""Triton's auto-complete for python models: the model's own ``auto_complete_config`` fills in its config.

A ``TritonPythonModel`` may define ``@staticmethod auto_complete_config(auto_complete_model_config)``; Triton
calls it at load with the config as parsed (possibly almost empty, or no ``config.pbtxt`` at all) and uses
what it returns. zinfer calls it the same way for every python model whose file defines it, but never in the
process that asks: the broker does not run model code. ``complete_python_config`` runs
``python -m zinfer.workers.auto_complete`` as a short-lived child (the server's user, the version folder as
its working directory, ``TIMEOUT_S`` to finish, at most ``MAX_OUTPUT_BYTES`` written to any file), hands it
the config as JSON on stdin and reads the completed config back as JSON. Whatever comes back is hostile until
``merge_auto_complete`` has checked it, field by field, through the same decoders as ``config.pbtxt``.

Only what the API can change is taken from the answer: ``max_batch_size``, the inputs and outputs it added
(the config's own are kept as they are), ``dynamic_batching`` (switched on with its defaults) and
``model_transaction_policy.decoupled``. The broker (``repository.load_model_entry``) and each worker
(``complete_config``) complete the config the same way, so they agree on the signature; the completed config
is what the ``config`` and metadata queries show.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from zinfer.client.dtypes import CONFIG_TYPES
from zinfer.client.errors import ConfigError

from .model_config import ModelConfig, parse_model_config
from .model_options import TransactionPolicy

__all__ = [
    "MAX_OUTPUT_BYTES",
    "PYTHON_DEFAULT_FILENAME",
    "TIMEOUT_S",
    "complete_python_config",
    "defines_auto_complete",
    "merge_auto_complete",
]

PYTHON_DEFAULT_FILENAME = "model.py"
TIMEOUT_S = 30.0
MAX_OUTPUT_BYTES = 1 << 20
_MAX_SOURCE_BYTES = 16 << 20
_MAX_TENSORS = 1024
_MAX_NAME = 256
_INPUT_KEYS = frozenset({"name", "data_type", "dims", "optional"})
_OUTPUT_KEYS = frozenset({"name", "data_type", "dims"})


def model_path(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or PYTHON_DEFAULT_FILENAME)


def defines_auto_complete(path: Path) -> bool:
    """Whether the model file mentions ``auto_complete_config`` (read as text, never imported)."""
    try:
        with open(path, "rb") as f:
            return b"auto_complete_config" in f.read(_MAX_SOURCE_BYTES)
    except OSError:
        return False


def _api_view(config: ModelConfig) -> dict[str, Any]:
    """The config as the model's ``as_dict()`` shows it; a transaction policy left at its default is absent,
    so that ``set_model_transaction_policy`` may set it, as in Triton."""
    view = config.to_dict()
    if not config.decoupled:
        view.pop("model_transaction_policy", None)
    return view


def _limit_output() -> None:  # pragma: no cover - runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES))


def _run_child(config: ModelConfig, path: Path, version: str) -> Mapping[str, Any]:
    where = f"model '{config.name}': auto_complete_config in {path}"
    command = [sys.executable, "-m", "zinfer.workers.auto_complete", str(path), config.name, version]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run(
                command,
                input=json.dumps(_api_view(config)).encode(),
                stdout=out,
                stderr=err,
                cwd=path.parent,
                timeout=TIMEOUT_S,
                preexec_fn=_limit_output,  # noqa: PLW1509 - no threads start before it in the child
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{where}: did not finish within {TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot start it: {exc}") from None
        size = os.fstat(out.fileno()).st_size
        out.seek(0)
        raw = out.read(MAX_OUTPUT_BYTES + 1)
        err.seek(max(0, os.fstat(err.fileno()).st_size - 2000))
        tail = err.read().decode("utf-8", "replace").strip()
    if proc.returncode != 0 or size > MAX_OUTPUT_BYTES:
        detail = f": {tail.splitlines()[-1]}" if tail else ""
        raise ConfigError(f"{where}: the run failed (exit {proc.returncode}){detail}")
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{where}: its answer is not JSON") from None
    if not isinstance(answer, dict):
        raise ConfigError(f"{where}: its answer is not a JSON object")
    if "error" in answer:
        raise ConfigError(f"{where}: {str(answer['error'])[:2000]}")
    result = answer.get("config")
    if not isinstance(result, dict):
        raise ConfigError(f"{where}: its answer holds no config")
    return result


def _quoted(value: object, what: str, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME or not value.isprintable():
        raise ConfigError(f"{where}: {what} must be a printable string of 1 to {_MAX_NAME} characters")
    return json.dumps(value)


def _tensor_text(kind: str, raw: object, keys: frozenset[str], where: str) -> str:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: every {kind} must be a dict")
    extra = sorted(set(raw) - keys)
    if extra:
        raise ConfigError(
            f"{where}: {kind} {raw.get('name')!r} has properties other than {sorted(keys)}: {extra}"
        )
    data_type = raw.get("data_type")
    if data_type not in CONFIG_TYPES:
        raise ConfigError(f"{where}: {kind} {raw.get('name')!r} has data_type {data_type!r}")
    dims = raw.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ConfigError(f"{where}: {kind} {raw.get('name')!r} needs dims, a list of integers")
    text = f"{kind} {{ name: {_quoted(raw.get('name'), f'a {kind} name', where)} data_type: {data_type} "
    text += f"dims: [ {', '.join(str(d) for d in dims)} ]"
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise ConfigError(f"{where}: {kind} {raw.get('name')!r}: optional must be true or false")
    return text + (" optional: true }" if optional else " }")


def merge_auto_complete(config: ModelConfig, result: Mapping[str, Any], source: str) -> ModelConfig:
    """``config`` with what ``auto_complete_config`` set in ``result`` (its ``as_dict()``), checked."""
    where = f"model '{config.name}': auto_complete_config"
    max_batch_size = result.get("max_batch_size", config.max_batch_size)
    if (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, int)
        or not 0 <= max_batch_size < 2**31
    ):
        raise ConfigError(f"{where}: max_batch_size must be a whole number >= 0, got {max_batch_size!r}")
    pieces = [f"max_batch_size: {max_batch_size}"]
    order: dict[str, list[str]] = {"input": [], "output": []}
    own = {"input": [t.name for t in config.input], "output": [t.name for t in config.output]}
    known = {kind: set(names) for kind, names in own.items()}
    for kind, keys in (("input", _INPUT_KEYS), ("output", _OUTPUT_KEYS)):
        listed = result.get(kind, [{"name": n} for n in own[kind]])
        if not isinstance(listed, list) or len(listed) > _MAX_TENSORS:
            raise ConfigError(f"{where}: {kind} must be a list of at most {_MAX_TENSORS} tensors")
        for raw in listed:
            name = raw.get("name") if isinstance(raw, Mapping) else None
            if isinstance(name, str) and name in known[kind]:
                order[kind].append(name)  # the config's own tensor: kept as config.pbtxt gives it
                continue
            pieces.append(_tensor_text(kind, raw, keys, where))
            order[kind].append(str(name))
    dynamic = config.dynamic_batching is None and "dynamic_batching" in result
    if dynamic:
        if config.sequence_batching is not None or config.ensemble_scheduling is not None:
            raise ConfigError(f"{where}: dynamic_batching set on a model with another scheduler")
        pieces.append("dynamic_batching { }")
    policy = result.get("model_transaction_policy", {})
    decoupled = policy.get("decoupled", config.decoupled) if isinstance(policy, Mapping) else None
    if not isinstance(decoupled, bool):
        raise ConfigError(f"{where}: model_transaction_policy.decoupled must be true or false")
    added = parse_model_config("\n".join(pieces), source=source, model_name=config.name)
    inputs = {t.name: t for t in (*config.input, *added.input)}
    outputs = {t.name: t for t in (*config.output, *added.output)}
    for kind in ("input", "output"):
        if len(set(order[kind])) != len(order[kind]):
            raise ConfigError(f"{where}: an {kind} name is listed twice")
    batching = config.dynamic_batching
    if dynamic:
        batching = added.dynamic_batching
    elif batching is not None and not batching.preferred_batch_size and max_batch_size > 0:
        batching = replace(batching, preferred_batch_size=(max_batch_size,))
    return replace(
        config,
        max_batch_size=max_batch_size,
        input=tuple(inputs[n] for n in order["input"]),
        output=tuple(outputs[n] for n in order["output"]),
        dynamic_batching=batching,
        model_transaction_policy=TransactionPolicy(decoupled=decoupled),
    )


def complete_python_config(config: ModelConfig, version_dir: Path) -> ModelConfig:
    """The config a python model's ``auto_complete_config`` completes; unchanged when it defines none."""
    path = model_path(config, version_dir)
    if not defines_auto_complete(path):
        return config
    result = _run_child(config, path, version_dir.name)
    return merge_auto_complete(config, result, f"{path}: auto_complete_config")
