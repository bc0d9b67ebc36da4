"""An ensemble's steps as a checked data-flow graph (``platform: "ensemble"``, ``ensemble_scheduling``).

Pure: built from the ensemble's config and its step models' configs, it checks what Triton checks when an
ensemble loads — every step's model exists and takes the tensors mapped to it, each tensor is produced by
one step only, every step input is an ensemble input or some step's output, every ensemble output is
produced, every ensemble input is used, data types agree along every edge, no step feeds itself through
the graph and no ensemble reaches itself through nested ensembles — and answers which steps can run once a
set of tensors exists. Maps follow Triton: ``input_map`` is model input → ensemble tensor,
``output_map`` is model output → ensemble tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig

__all__ = ["EnsemblePlan", "PlanStep", "build_plan", "name_step"]

ConfigLookup = Callable[[str], "ModelConfig | str"]
"""A step model's config by name, or the reason it cannot be had."""


@dataclass(frozen=True, slots=True)
class PlanStep:
    index: int  # 1-based, as errors name it
    model: str
    version: int  # 0: the latest ready version (model_version -1)
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (model output, ensemble tensor)

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model}')"

    def tensor_of(self, output: str) -> str | None:
        """The ensemble tensor the model output ``output`` becomes, None if the step does not map it."""
        for model_output, tensor in self.outputs:
            if model_output == output:
                return tensor
        return None


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    steps: tuple[PlanStep, ...]
    inputs: frozenset[str]  # the ensemble's input tensors
    outputs: frozenset[str]  # the ensemble's output tensors
    producer: Mapping[str, int]  # tensor → position in ``steps`` of the step that makes it
    consumers: Mapping[str, tuple[int, ...]]  # tensor → positions of the steps that read it

    def runnable(self, have: Container[str], started: set[int]) -> list[int]:
        """The positions of the steps not yet started whose every input tensor exists."""
        return [
            i
            for i, step in enumerate(self.steps)
            if i not in started and all(t in have for _, t in step.inputs)
        ]

    def is_intermediate(self, tensor: str) -> bool:
        """Whether a later step reads ``tensor`` (so it must live in the server's memory)."""
        return bool(self.consumers.get(tensor))


def name_step(ensemble: str, step: PlanStep, error: str) -> str:
    """``Class: in ensemble 'e' step N (model 'm'): message``, keeping the error's class for the client."""
    cls, sep, message = error.partition(": ")
    where = f"in ensemble '{ensemble}' {step.label}"
    if sep and cls.isidentifier():
        return f"{cls}: {where}: {message}"
    return f"InternalError: {where}: {error}"


def _error(name: str, text: str) -> ConfigError:
    return ConfigError(f"ensemble '{name}': {text}")


def build_plan(config: ModelConfig, lookup: ConfigLookup, depth: int = 0) -> EnsemblePlan:
    """The checked plan of an ensemble, or ``ConfigError`` naming the step and tensor at fault."""
    name = config.name
    sched = config.ensemble_scheduling
    if config.platform != "ensemble" or sched is None:
        raise _error(name, 'an ensemble needs platform: "ensemble" and ensemble_scheduling')
    inputs = {t.name: t.data_type for t in config.input}
    outputs = {t.name: t.data_type for t in config.output}
    types: dict[str, str] = dict(inputs)  # tensor → data type, as far as known
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    steps: list[PlanStep] = []
    step_configs: list[ModelConfig] = []
    for pos, raw in enumerate(sched.step):
        label = f"step {pos + 1} (model '{raw.model_name}')"
        if not raw.model_name:
            raise _error(name, f"step {pos + 1} names no model_name")
        if raw.model_name == name:
            raise _error(name, f"{label} is the ensemble itself")
        found = lookup(raw.model_name)
        if isinstance(found, str):
            raise _error(name, f"{label} cannot be used: {found}")
        step_configs.append(found)
        if raw.model_version < -1:
            raise _error(name, f"{label} has model_version {raw.model_version}; use -1 or a version")
        if not raw.input_map:
            raise _error(name, f"{label} has an empty input_map")
        model_inputs = {t.name: t for t in found.input}
        model_outputs = {t.name: t for t in found.output}
        for model_input, tensor in raw.input_map.items():
            if model_input not in model_inputs:
                raise _error(name, f"{label}: input_map names '{model_input}', the model takes "
                                   f"{sorted(model_inputs)}")  # fmt: skip
            consumers.setdefault(tensor, []).append(pos)
        unmapped = [n for n, t in model_inputs.items() if n not in raw.input_map and not t.optional]
        if unmapped:
            raise _error(name, f"{label}: model input {', '.join(map(repr, unmapped))} is not in input_map")
        for model_output, tensor in raw.output_map.items():
            if model_output not in model_outputs:
                raise _error(name, f"{label}: output_map names '{model_output}', the model has "
                                   f"{sorted(model_outputs)}")  # fmt: skip
            if tensor in inputs:
                raise _error(name, f"{label}: output '{model_output}' writes ensemble input '{tensor}'")
            if tensor in producer:
                other = steps[producer[tensor]].label
                raise _error(name, f"tensor '{tensor}' is produced by both {other} and {label}")
            producer[tensor] = pos
            types[tensor] = model_outputs[model_output].data_type
        if config.max_batch_size > 0 and found.max_batch_size < config.max_batch_size:
            raise _error(name, f"{label} has max_batch_size {found.max_batch_size}, less than the "
                               f"ensemble's {config.max_batch_size}")  # fmt: skip
        steps.append(PlanStep(pos + 1, raw.model_name, max(raw.model_version, 0),
                              tuple(raw.input_map.items()), tuple(raw.output_map.items())))  # fmt: skip
    for step, found in zip(steps, step_configs, strict=True):
        model_inputs = {t.name: t for t in found.input}
        for model_input, tensor in step.inputs:
            if tensor not in types:
                raise _error(name, f"{step.label}: input '{model_input}' reads tensor '{tensor}', which is "
                                   "neither an ensemble input nor any step's output")  # fmt: skip
            want = model_inputs[model_input].data_type
            if types[tensor] != want:
                raise _error(name, f"{step.label}: input '{model_input}' is {want}, tensor '{tensor}' is "
                                   f"{types[tensor]}")  # fmt: skip
    for tensor, data_type in outputs.items():
        if tensor not in producer:
            raise _error(name, f"ensemble output '{tensor}' is not produced by any step")
        if types[tensor] != data_type:
            raise _error(name, f"ensemble output '{tensor}' is {data_type}, "
                               f"{steps[producer[tensor]].label} makes it {types[tensor]}")  # fmt: skip
    unused = sorted(t for t in inputs if t not in consumers)
    if unused:
        raise _error(name, f"ensemble input {', '.join(map(repr, unused))} is not used by any step")
    _check_acyclic(name, steps, producer)
    if depth < 8:
        for step, found in zip(steps, step_configs, strict=True):
            if found.platform == "ensemble":
                try:
                    build_plan(found, lookup, depth + 1)
                except ConfigError as exc:
                    raise _error(name, f"{step.label} is an ensemble that cannot run: {exc}") from None
    else:
        raise _error(name, "ensembles nest more than 8 deep (does one reach itself?)")
    return EnsemblePlan(
        name,
        tuple(steps),
        frozenset(inputs),
        frozenset(outputs),
        producer,
        {t: tuple(c) for t, c in consumers.items()},
    )


def _check_acyclic(name: str, steps: list[PlanStep], producer: Mapping[str, int]) -> None:
    """Raise unless the steps can all run: repeatedly run the steps whose inputs exist."""
    have = {t for step in steps for _, t in step.inputs if t not in producer}
    started: set[int] = set()
    while True:
        ready = [i for i, s in enumerate(steps) if i not in started and all(t in have for _, t in s.inputs)]
        if not ready:
            break
        for i in ready:
            started.add(i)
            have.update(t for _, t in steps[i].outputs)
    stuck = [steps[i].label for i in range(len(steps)) if i not in started]
    if stuck:
        raise _error(name, f"{', '.join(stuck)} can never run: the steps form a cycle")
