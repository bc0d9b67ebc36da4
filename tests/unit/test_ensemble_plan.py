"""The ensemble plan: Triton's load-time checks and the order steps become runnable."""

from __future__ import annotations

import pytest

from zinfer.broker.ensemble_plan import build_plan
from zinfer.client.errors import ConfigError
from zinfer.modelconfig.model_config import ModelConfig, parse_model_config


def model(name: str, ins: dict[str, str], outs: dict[str, str], mbs: int = 8) -> ModelConfig:
    i = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in ins.items())
    o = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in outs.items())
    text = f'name: "{name}"\nbackend: "python"\nmax_batch_size: {mbs}\ninput [ {i} ]\noutput [ {o} ]\n'
    return parse_model_config(text, source=f"{name}/config.pbtxt", model_name=name)


def step(m: str, ins: dict[str, str], outs: dict[str, str], version: int = -1) -> str:
    i = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items())
    o = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items())
    return f'{{ model_name: "{m}" model_version: {version} {i} {o} }}'


def ensemble(steps: list[str], ins: dict[str, str] | None = None, outs: dict[str, str] | None = None,
             name: str = "ens", mbs: int = 8) -> ModelConfig:  # fmt: skip
    ins = ins or {"X": "TYPE_FP32"}
    outs = outs or {"Y": "TYPE_FP32"}
    i = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in ins.items())
    o = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ -1 ] }}' for n, t in outs.items())
    text = (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\ninput [ {i} ]\noutput [ {o} ]\n'
            f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n")  # fmt: skip
    return parse_model_config(text, source=f"{name}/config.pbtxt", model_name=name)


F = "TYPE_FP32"
MODELS = {
    "a": model("a", {"IN": F}, {"OUT": F}),
    "b": model("b", {"IN": F}, {"OUT": F}),
    "join": model("join", {"L": F, "R": F}, {"OUT": F}),
    "text": model("text", {"T": "TYPE_STRING"}, {"OUT": F}),
    "small": model("small", {"IN": F}, {"OUT": F}, mbs=2),
}


def lookup(name: str) -> ModelConfig | str:
    return MODELS.get(name, "no such model in the repository")


def test_a_diamond_runs_in_dependency_order() -> None:
    plan = build_plan(
        ensemble([
            step("join", {"L": "l", "R": "r"}, {"OUT": "Y"}),
            step("a", {"IN": "X"}, {"OUT": "l"}),
            step("b", {"IN": "X"}, {"OUT": "r"}),
        ]),
        lookup,
    )  # fmt: skip
    assert [s.model for s in plan.steps] == ["join", "a", "b"]
    assert plan.runnable({"X"}, set()) == [1, 2]
    assert plan.runnable({"X", "l"}, {1, 2}) == []
    assert plan.runnable({"X", "l", "r"}, {1, 2}) == [0]
    assert plan.is_intermediate("l") and plan.is_intermediate("X") and not plan.is_intermediate("Y")
    assert plan.producer == {"Y": 0, "l": 1, "r": 2}
    assert plan.steps[0].version == 0 and plan.steps[0].label == "step 1 (model 'join')"


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([step("nope", {"IN": "X"}, {"OUT": "Y"})], "step 1 (model 'nope') cannot be used: no such model"),
        ([step("a", {"WRONG": "X"}, {"OUT": "Y"})], "input_map names 'WRONG'"),
        ([step("a", {"IN": "X"}, {"WRONG": "Y"})], "output_map names 'WRONG'"),
        ([step("join", {"L": "X"}, {"OUT": "Y"})], "model input 'R' is not in input_map"),
        ([step("a", {"IN": "X"}, {"OUT": "Y"}), step("b", {"IN": "X"}, {"OUT": "Y"})], "produced by both"),
        ([step("a", {"IN": "missing"}, {"OUT": "Y"})], "neither an ensemble input nor any step's output"),
        ([step("a", {"IN": "X"}, {"OUT": "Z"})], "ensemble output 'Y' is not produced"),
        ([step("text", {"T": "X"}, {"OUT": "Y"})], "input 'T' is TYPE_STRING, tensor 'X' is TYPE_FP32"),
        ([step("small", {"IN": "X"}, {"OUT": "Y"})], "max_batch_size 2, less than the ensemble's 8"),
        ([step("a", {"IN": "X"}, {"OUT": "X"})], "writes ensemble input 'X'"),
        ([step("ens", {"IN": "X"}, {"OUT": "Y"})], "is the ensemble itself"),
        (
            [
                step("a", {"IN": "q"}, {"OUT": "p"}),
                step("b", {"IN": "p"}, {"OUT": "q"}),
                step("join", {"L": "X", "R": "p"}, {"OUT": "Y"}),
            ],  # fmt: skip
            "form a cycle",
        ),
    ],
)
def test_load_errors_name_the_step_and_tensor(steps: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_plan(ensemble(steps), lookup)
    assert message in str(info.value)
    assert str(info.value).startswith("ensemble 'ens': ")


def test_unused_inputs_and_output_types_are_checked() -> None:
    with pytest.raises(ConfigError, match="ensemble input 'W' is not used"):
        build_plan(ensemble([step("a", {"IN": "X"}, {"OUT": "Y"})], ins={"X": F, "W": F}), lookup)
    with pytest.raises(ConfigError, match="ensemble output 'Y' is TYPE_INT32"):
        build_plan(ensemble([step("a", {"IN": "X"}, {"OUT": "Y"})], outs={"Y": "TYPE_INT32"}), lookup)


def test_nested_ensembles_and_loops_through_them() -> None:
    inner = ensemble([step("a", {"IN": "X"}, {"OUT": "Y"})], name="inner")
    outer = ensemble([step("inner", {"X": "X"}, {"Y": "Y"})], name="outer")
    models = {**MODELS, "inner": inner, "outer": outer}
    plan = build_plan(outer, lambda n: models.get(n, "missing"))
    assert [s.model for s in plan.steps] == ["inner"]
    # two ensembles that use each other can never run
    loop_a = ensemble([step("loop_b", {"X": "X"}, {"Y": "Y"})], name="loop_a")
    loop_b = ensemble([step("loop_a", {"X": "X"}, {"Y": "Y"})], name="loop_b")
    models = {"loop_a": loop_a, "loop_b": loop_b}
    with pytest.raises(ConfigError, match="nest more than 8 deep"):
        build_plan(loop_a, lambda n: models.get(n, "missing"))


def test_an_ensemble_needs_its_platform() -> None:
    with pytest.raises(ConfigError, match="platform"):
        build_plan(MODELS["a"], lookup)
