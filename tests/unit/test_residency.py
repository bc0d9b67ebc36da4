"""The eviction policy of on-demand model control (``broker/residency.py``) and the budget syntax
(``broker/memory_budget.py``): pure functions, the clock passed in."""

from __future__ import annotations

import re

import pytest

from zinfer.broker.memory_budget import MemoryBudget, device_memory, parse_budget, parse_bytes
from zinfer.broker.residency import Resident, estimate, idle, over_budget, plan_room, total

MB = 1 << 20
HOST = MemoryBudget({"host": 300 * MB})


def r(name: str, mb: int, last: float, in_use: bool = False, pinned: bool = False, gpu: int = 0) -> Resident:
    fp = {"host": mb * MB}
    if gpu:
        fp["gpu0"] = gpu * MB
    return Resident(name, fp, last, in_use, pinned)


# ------------------------------------------------------------------------------------ budget syntax


@pytest.mark.parametrize(
    ("text", "n"),
    [("512", 512), ("512M", 512 * MB), ("2G", 2 << 30), ("1.5GiB", int(1.5 * (1 << 30))), ("64kb", 64 << 10),
     (" 3 T ", 3 << 40)],
)  # fmt: skip
def test_sizes_take_binary_suffixes(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "M", "-1G", "2X", "1e9", "0", "0.1"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_budgets_per_memory() -> None:
    b = parse_budget(["host=2G", "GPU1=512M"])
    assert b.limits == {"host": 2 << 30, "gpu1": 512 * MB}
    assert "host budget of 2.0 GiB" in b.describe("host")
    assert "--memory-budget gpu1=" in b.describe("gpu1")
    assert not parse_budget([])


@pytest.mark.parametrize("items", [["ram=1G"], ["host"], ["host=1G", "host=2G"], ["gpu=1G"], ["host=lots"]])
def test_bad_budgets_name_the_item(items: list[str]) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(items[-1]))):
        parse_budget(items)


def test_device_memory_of_a_placement() -> None:
    assert device_memory("cpu") == "host"
    assert device_memory("gpu:3") == "gpu3"


# ------------------------------------------------------------------------------------ plan_room


def test_room_to_spare_evicts_nothing() -> None:
    plan = plan_room(HOST, [r("a", 100, 1.0), r("b", 100, 2.0)], {"host": 100 * MB})
    assert plan.fits and not plan.wait and plan.victims == ()


def test_the_least_recently_used_goes_first() -> None:
    residents = [r("a", 100, 5.0), r("b", 100, 1.0), r("c", 100, 3.0)]
    plan = plan_room(HOST, residents, {"host": 100 * MB})
    assert plan.victims == ("b",)
    assert plan.fits and plan.wait  # b's memory must be gone before the load starts


def test_as_many_as_needed_in_lru_order() -> None:
    residents = [r("a", 100, 5.0), r("b", 100, 1.0), r("c", 100, 3.0)]
    plan = plan_room(HOST, residents, {"host": 150 * MB})
    assert plan.victims == ("b", "c")
    assert plan_room(HOST, residents, {"host": 250 * MB}).victims == ("b", "c", "a")


def test_models_in_use_and_pinned_ones_are_never_evicted() -> None:
    residents = [r("busy", 100, 0.0, in_use=True), r("pin", 100, 0.5, pinned=True), r("old", 100, 9.0)]
    plan = plan_room(HOST, residents, {"host": 100 * MB})
    assert plan.victims == ("old",)


def test_nothing_evictable_fails_and_names_the_budget_and_the_holders() -> None:
    residents = [r("busy", 150, 0.0, in_use=True), r("pin", 100, 0.5, pinned=True)]
    plan = plan_room(HOST, residents, {"host": 100 * MB})
    assert not plan.fits and plan.victims == ()
    assert "host budget of 300.0 MiB" in plan.short
    assert "busy (in use)" in plan.short and "pin (pinned)" in plan.short


def test_a_model_larger_than_the_budget_fails_without_evicting() -> None:
    plan = plan_room(HOST, [r("a", 10, 0.0)], {"host": 301 * MB})
    assert not plan.fits and plan.victims == ()
    assert "more than the host budget" in plan.short


def test_loads_under_way_count() -> None:
    plan = plan_room(HOST, [r("a", 100, 0.0)], {"host": 100 * MB}, loading={"host": 150 * MB})
    assert plan.victims == ("a",)


def test_memory_being_freed_makes_the_load_wait_but_not_evict() -> None:
    plan = plan_room(HOST, [r("a", 100, 0.0)], {"host": 100 * MB}, freeing={"host": 150 * MB})
    assert plan.victims == () and plan.fits and plan.wait
    later = plan_room(HOST, [r("a", 100, 0.0)], {"host": 100 * MB}, freeing={})
    assert later.fits and not later.wait


def test_a_device_budget_evicts_only_models_on_that_device() -> None:
    budget = MemoryBudget({"host": 10_000 * MB, "gpu0": 1000 * MB})
    residents = [r("cpu_old", 100, 0.0), r("gpu_a", 100, 1.0, gpu=600), r("gpu_b", 100, 2.0, gpu=300)]
    plan = plan_room(budget, residents, {"host": 100 * MB, "gpu0": 400 * MB})
    assert plan.victims == ("gpu_a",)  # the LRU CPU model frees no device memory: it stays


def test_memories_without_a_budget_have_no_limit() -> None:
    budget = MemoryBudget({"gpu0": 100 * MB})
    plan = plan_room(budget, [r("a", 10_000, 0.0)], {"host": 10_000 * MB})
    assert plan.fits and plan.victims == ()


def test_ties_in_last_use_break_by_name() -> None:
    plan = plan_room(HOST, [r("b", 100, 1.0), r("a", 100, 1.0), r("c", 100, 1.0)], {"host": 100 * MB})
    assert plan.victims == ("a",)


# ------------------------------------------------------------------------------------ after a measure


def test_over_budget_after_a_measure_evicts_lru_but_keeps_the_new_one() -> None:
    residents = [r("new", 150, 0.0), r("a", 100, 1.0), r("b", 100, 2.0)]
    assert over_budget(HOST, residents, keep=frozenset({"new"})) == ("a",)
    assert over_budget(HOST, residents[1:]) == ()


def test_idle_models_unload_after_their_time_lru_first() -> None:
    residents = [r("a", 10, 100.0), r("b", 10, 10.0), r("c", 10, 50.0, in_use=True),
                 r("d", 10, 0.0, pinned=True)]  # fmt: skip
    assert idle(residents, now=110.0, idle_s=30.0) == ("b",)
    assert idle(residents, now=200.0, idle_s=30.0) == ("b", "a")
    assert idle(residents, now=20.0, idle_s=30.0) == ()


# ------------------------------------------------------------------------------------ estimates


def test_estimate_prefers_the_last_measurement() -> None:
    assert estimate(["cpu"], {"host": 7}, {"host": 100}) == {"host": 7}


def test_estimate_from_the_mean_instance_per_device() -> None:
    per = {"host": 50, "gpu": 1000}
    assert estimate(["cpu", "cpu"], None, per) == {"host": 100}
    assert estimate(["gpu:0", "gpu:1", "gpu:1"], None, per) == {"host": 150, "gpu0": 1000, "gpu1": 2000}
    assert estimate(["cpu"], None, {}) == {}  # nothing measured yet: the first load just goes
    assert estimate([], None, per) == {}  # an ensemble has no instances


def test_total_adds_per_memory() -> None:
    assert total([{"host": 1}, {"host": 2, "gpu0": 3}, {}]) == {"host": 3, "gpu0": 3}


# ------------------------------------------------------------------------------------ metrics


def test_residency_metrics_render_as_prometheus_families() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from zinfer.broker.residency_metrics import ResidencyMetrics

    m = ResidencyMetrics({"host": 300 * MB})
    m.loaded("a", True, 0.3)
    m.loaded("a", True, 3.0)
    m.loaded("b", False)
    m.evicted("a", "budget")
    m.measured({"a": {"host": 10 * MB}, "b": {"host": 5 * MB, "gpu0": 7}})
    registry = CollectorRegistry()
    registry.register(m)
    text = generate_latest(registry).decode()
    assert 'zinfer_model_loads_total{model="a",result="ok"} 2.0' in text
    assert 'zinfer_model_loads_total{model="b",result="failed"} 1.0' in text
    assert 'zinfer_model_evictions_total{model="a",reason="budget"} 1.0' in text
    assert 'zinfer_model_cold_start_seconds_bucket{le="0.25"} 0.0' in text
    assert 'zinfer_model_cold_start_seconds_bucket{le="0.5"} 1.0' in text
    assert 'zinfer_model_cold_start_seconds_bucket{le="+Inf"} 2.0' in text
    assert "zinfer_model_cold_start_seconds_sum 3.3" in text
    assert 'zinfer_model_resident_bytes{memory="gpu0",model="b"} 7.0' in text
    assert 'zinfer_memory_resident_bytes{memory="host"} 1.572864e+07' in text
    assert 'zinfer_memory_budget_bytes{memory="host"} 3.145728e+08' in text
