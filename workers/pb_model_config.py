"""``pb_utils.ModelConfig``: the object Triton hands ``TritonPythonModel.auto_complete_config``.

``as_dict()`` and the setters ``set_max_batch_size``, ``add_input``, ``add_output``, ``set_dynamic_batching``
and ``set_model_transaction_policy``, with the checks Triton documents (each raises ``ValueError`` naming the
model and the tensor). ``zinfer.workers.auto_complete`` runs the hook with it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["ModelConfig"]


def _tensor_fields(kind: str, tensor: Any, allowed: tuple[str, ...], model: str) -> dict[str, Any]:
    if not isinstance(tensor, dict):
        raise ValueError(f"{kind} in auto-complete-config function for model '{model}' must be a dict")
    name = tensor.get("name")
    extra = [key for key in tensor if key not in allowed]
    if extra:
        raise ValueError(
            f"{kind} '{name}' in auto-complete-config function for model '{model}' contains property other "
            f"than {', '.join(repr(k) for k in allowed)}"
        )
    if "name" not in tensor:
        raise ValueError(
            f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property."
        )
    for key in ("data_type", "dims"):
        if key not in tensor:
            raise ValueError(
                f"{kind} '{name}' in auto-complete-config function for model '{model}' "
                f"is missing '{key}' property."
            )
    return dict(tensor)


class ModelConfig:
    """What ``auto_complete_config`` receives and returns (Triton's ``pb_utils.ModelConfig``)."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        loaded = json.loads(model_config) if isinstance(model_config, str) else copy.deepcopy(model_config)
        loaded.setdefault("input", [])
        loaded.setdefault("output", [])
        loaded.setdefault("max_batch_size", 0)
        self._model_config: dict[str, Any] = loaded

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise ValueError(f"max_batch_size for model '{self._name}' must be a whole number >= 0")
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._model_config.get(other):
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add(self, kind: str, tensor: Any, allowed: tuple[str, ...]) -> None:
        new = _tensor_fields(kind, tensor, allowed, self._name)
        for current in self._model_config[kind]:
            if current.get("name") != new["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", new["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{current['data_type']} for {kind} '{new['name']}', model provides {new['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(new["dims"]):
                raise ValueError(
                    f"model '{self._name}', tensor '{new['name']}': the model expects dims {new['dims']} "
                    f"but the model configuration specifies dims {current['dims']}"
                )
            if "optional" in new and "optional" in current and current["optional"] != new["optional"]:
                raise ValueError(
                    f"model '{self._name}', tensor '{new['name']}': the model expects optional "
                    f"{new['optional']} but the model configuration specifies optional {current['optional']}"
                )
            current.update(new)
            return
        self._model_config[kind].append(new)

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if not isinstance(transaction_policy_dict, dict) or set(transaction_policy_dict) - {"decoupled"}:
            raise ValueError(
                f"model transaction property in auto-complete-config function for model '{self._name}' "
                "contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
