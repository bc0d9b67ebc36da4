"""The rate limiter: pool sizes, acquire and release, per-device and global pools, turns between models,
and which instance group each instance belongs to."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from zinfer.broker.batching.rate_limiter import (
    Need,
    RateLimiter,
    needs_of,
    normalize_device,
    normalize_resources,
)
from zinfer.broker.model_state import instance_groups
from zinfer.modelconfig.model_config import parse_model_config


def limiter(*resources: Any) -> RateLimiter[str, str]:
    return RateLimiter(resources)


R1 = Need("R1", 1)
G1 = Need("G", 1, is_global=True)


# ------------------------------------------------------------------------------------------ server sizes


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((), ()),
        ({"R1": 4, "R2": 0}, (("R1", 4, None), ("R2", 0, None))),
        ([("R1", 2, None), ("R1", 3, "gpu:1")], (("R1", 2, None), ("R1", 3, "gpu:1"))),
        ([("R", 1, "0"), ("R", 1, "GPU:2"), ("R", 1, "cpu"), ("R", 1, "")], (
            ("R", 1, "gpu:0"), ("R", 1, "gpu:2"), ("R", 1, "cpu"), ("R", 1, None))),
    ],
)  # fmt: skip
def test_server_sizes_are_normalised(given: Any, expected: tuple[Any, ...]) -> None:
    assert normalize_resources(given) == expected


@pytest.mark.parametrize(
    "given", [[("", 1, None)], [("R", -1, None)], [("R", True, None)], [("R", 1, "tpu:0")], {"R": 1.5}]
)
def test_bad_server_sizes_are_refused(given: Any) -> None:
    with pytest.raises(ValueError):
        normalize_resources(given)


def test_device_names() -> None:
    assert [normalize_device(d) for d in (None, "", "cpu", "CPU", "3", "gpu:3")] == [
        None, None, "cpu", "cpu", "gpu:3", "gpu:3"]  # fmt: skip


# ------------------------------------------------------------------------------------------ pool sizes


def test_a_pool_not_given_holds_the_most_any_one_instance_asks_for() -> None:
    rl = limiter()
    rl.add("a", "A", "cpu", [Need("R1", 4), Need("R2", 4)])
    rl.add("b", "B", "cpu", [Need("R2", 5), Need("R3", 10)])
    rl.add("c", "C", "cpu", [Need("R1", 1), Need("R3", 7)])
    assert [rl.capacity(r, "cpu") for r in ("R1", "R2", "R3", "R4")] == [4, 5, 10, 0]
    rl.remove("b")  # sizes follow the instances that are there
    assert [rl.capacity(r, "cpu") for r in ("R1", "R2", "R3")] == [4, 4, 7]


def test_pools_are_per_device_unless_global() -> None:
    rl = limiter()
    rl.add("a", "A", "gpu:0", [Need("R", 2), Need("G", 3, is_global=True)])
    rl.add("b", "B", "gpu:1", [Need("R", 1), Need("G", 1, is_global=True)])
    assert (rl.capacity("R", "gpu:0"), rl.capacity("R", "gpu:1"), rl.capacity("R", None)) == (2, 1, 0)
    assert (rl.capacity("G", None), rl.capacity("G", "gpu:0")) == (3, 0)
    assert rl.pools() == {("G", None): (0, 3), ("R", "gpu:0"): (0, 2), ("R", "gpu:1"): (0, 1)}


def test_the_server_gives_sizes_per_device_or_for_all() -> None:
    # Triton's example: --rate-limit-resource R1:10 R2:5:0 R2:8:1 R3:2 (R3 global in a model)
    rl = limiter(("R1", 10, None), ("R2", 5, "gpu:0"), ("R2", 8, "gpu:1"), ("R3", 2, None))
    rl.add("x", "X", "gpu:0", [Need("R3", 1, is_global=True)])
    assert rl.capacity("R3", None) == 2
    assert [rl.capacity("R1", d) for d in ("gpu:0", "gpu:1", "cpu")] == [10, 10, 10]
    assert [rl.capacity("R2", d) for d in ("gpu:0", "gpu:1")] == [5, 8]
    rl.add("y", "Y", "gpu:2", [Need("R2", 3)])
    assert rl.capacity("R2", "gpu:2") == 3  # a device the server did not size: the largest need


def test_an_instance_that_needs_more_than_the_server_gives_can_never_run() -> None:
    rl = limiter(("R", 1, None))
    assert rl.add("a", "A", "cpu", [Need("R", 1)]) is None
    error = rl.add("b", "B", "gpu:0", [Need("R", 2)])
    assert error is not None and "'R'" in error and "needs 2" in error and "has 1" in error
    assert not rl.acquire("b")


# ------------------------------------------------------------------------------------------ acquire


def test_acquire_takes_everything_or_nothing_and_release_gives_it_back() -> None:
    rl = limiter(("A", 2, None), ("B", 1, None))
    rl.add("x", "X", "cpu", [Need("A", 1), Need("B", 1)])
    rl.add("y", "Y", "cpu", [Need("A", 1)])
    rl.add("z", "Z", "cpu", [Need("A", 1), Need("B", 1)])
    assert rl.acquire("x")
    assert not rl.acquire("z")  # B is taken: nothing of z's is held
    assert (rl.held("A", "cpu"), rl.held("B", "cpu")) == (1, 1)
    assert rl.acquire("y")
    assert not rl.acquire("y")  # an instance runs one batch at a time
    assert (rl.held("A", "cpu"), rl.held("B", "cpu")) == (2, 1)
    rl.release("x")
    rl.release("x")  # a second release gives nothing back twice
    assert (rl.held("A", "cpu"), rl.held("B", "cpu")) == (1, 0)
    assert rl.acquire("z") and rl.holding("z")  # A: y and z, B: z
    assert (rl.held("A", "cpu"), rl.held("B", "cpu")) == (2, 1)
    assert not rl.acquire("x")
    rl.release("y")
    assert not rl.acquire("x")  # A has room again, B does not


def test_instances_without_resources_and_unknown_ones_always_run() -> None:
    rl = limiter(("R", 0, None))
    rl.add("free", "F", "cpu", [])
    assert rl.acquire("free") and rl.acquire("free") and not rl.limits("free")
    assert rl.can_acquire("never-added") and rl.acquire("never-added")


def test_a_global_pool_is_shared_by_every_device() -> None:
    rl = limiter()
    for i, device in enumerate(("cpu", "gpu:0", "gpu:1")):
        rl.add(f"i{i}", "M", device, [G1])
    assert rl.acquire("i0")
    assert not rl.acquire("i1") and not rl.acquire("i2")
    rl.release("i0")
    assert rl.acquire("i2")


def test_per_device_pools_do_not_block_each_other() -> None:
    rl = limiter()
    rl.add("a0", "A", "gpu:0", [R1])
    rl.add("b0", "B", "gpu:0", [R1])
    rl.add("a1", "A", "gpu:1", [R1])
    assert rl.acquire("a0") and rl.acquire("a1")
    assert not rl.acquire("b0")


def test_removing_a_dead_instance_gives_back_what_it_held() -> None:
    rl = limiter(("R", 1, None))
    rl.add("a", "A", "cpu", [R1])
    rl.add("b", "B", "cpu", [R1])
    assert rl.acquire("a") and not rl.acquire("b")
    rl.remove("a")
    assert rl.held("R", "cpu") == 0 and not rl.known("a")
    assert rl.acquire("b")


@pytest.mark.parametrize("seed", range(5))
def test_never_more_than_the_pool_under_random_load(seed: int) -> None:
    rng = random.Random(seed)
    rl = limiter(("G", 3, None), ("R", 2, None))
    instances = []
    for i in range(12):
        device = rng.choice(["cpu", "gpu:0", "gpu:1"])
        needs = [Need("G", rng.randint(1, 3), is_global=True)] if rng.random() < 0.7 else []
        if rng.random() < 0.6:
            needs.append(Need("R", rng.randint(1, 2)))
        rl.add(f"i{i}", f"m{i % 3}", device, needs)
        instances.append(f"i{i}")
    for _ in range(2000):
        inst = rng.choice(instances)
        if rng.random() < 0.5:
            rl.acquire(inst)
        else:
            rl.release(inst)
        for (name, device), (held, capacity) in rl.pools().items():
            assert 0 <= held <= capacity, (name, device)


# ------------------------------------------------------------------------------------------ turns


def serve(rl: RateLimiter[str, str], waiting: list[str], turns: int, priority: dict[str, int]) -> list[str]:
    order = []
    for _ in range(turns):
        first = rl.turn_order(waiting)[0]
        rl.served(first, priority.get(first, 1))
        order.append(first)
    return order


def test_models_waiting_for_the_same_resource_take_turns() -> None:
    rl = limiter()
    assert serve(rl, ["a", "b", "c"], 6, {}) == ["a", "b", "c", "a", "b", "c"]


def test_a_model_that_could_not_run_keeps_its_place() -> None:
    rl = limiter()
    rl.served("a")
    assert rl.turn_order(["a", "b"]) == ["b", "a"]  # b waited: it goes first when resources come back
    assert rl.turn_order(["b", "a"]) == ["b", "a"]


def test_priority_is_a_weight() -> None:
    rl = limiter()
    counts = Counter(serve(rl, ["p1", "p2", "p4"], 700, {"p1": 1, "p2": 2, "p4": 4}))
    assert counts["p1"] == pytest.approx(400, abs=2)  # weights 1 : 1/2 : 1/4
    assert counts["p2"] == pytest.approx(200, abs=2)
    assert counts["p4"] == pytest.approx(100, abs=2)


def test_priority_zero_counts_as_one() -> None:
    rl = limiter()
    counts = Counter(serve(rl, ["a", "b"], 100, {"a": 0, "b": 1}))
    assert counts["a"] == counts["b"] == 50


def test_a_model_back_from_idle_cannot_claim_the_turns_it_missed() -> None:
    rl = limiter()
    rl.turn_order(["a", "b"])
    serve(rl, ["a"], 50, {})  # b had nothing to do meanwhile
    assert serve(rl, ["a", "b"], 6, {}).count("b") == 3


# ------------------------------------------------------------------------------------------ groups


def cfg(groups: str) -> Any:
    text = f'name: "m"\nbackend: "python"\ninstance_group [ {groups} ]\n'
    return parse_model_config(text, source="config.pbtxt", model_name="m")


@pytest.mark.parametrize(
    ("groups", "instances", "expected"),
    [
        ("{ kind: KIND_CPU count: 2 }, { kind: KIND_CPU count: 1 }", 3, [0, 0, 1]),
        ("{ kind: KIND_GPU count: 2 gpus: [ 0, 1 ] }, { kind: KIND_CPU }", 5, [0, 0, 0, 0, 1]),
        (
            "{ kind: KIND_CPU }, { kind: KIND_GPU count: 2 }, { kind: KIND_CPU }",
            6,
            [0, 1, 1, 1, 1, 2],
        ),  # 2 GPUs
        ("{ kind: KIND_AUTO count: 2 }, { kind: KIND_CPU }", 3, [0, 0, 1]),  # KIND_AUTO without GPUs
        ("{ kind: KIND_AUTO }, { kind: KIND_GPU count: 2 }", 9, [0, 0, 0, 1, 1, 1, 1, 1, 1]),  # 3 GPUs
    ],
)
def test_each_instance_index_maps_to_its_group(groups: str, instances: int, expected: list[int]) -> None:
    config = cfg(groups)
    found = instance_groups(config, instances)
    assert [config.instance_group.index(g) for g in found] == expected
    assert instance_groups(config, instances + 1)[-1] is None


def test_needs_of_a_group() -> None:
    config = cfg(
        "{ kind: KIND_CPU rate_limiter { resources [ { name: 'R' count: 2 },"
        " { name: 'G' global: true count: 1 }, { name: 'Z' count: 0 } ] priority: 3 } }, { kind: KIND_CPU }"
    )
    with_rl, without = config.instance_group
    assert needs_of(with_rl) == ((Need("R", 2), Need("G", 1, is_global=True)), 3)
    assert needs_of(without) == ((), 1)
    assert needs_of(None) == ((), 1)
