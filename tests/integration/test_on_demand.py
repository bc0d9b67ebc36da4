"""On-demand model control on real ``zinfer serve`` processes: models load on their first request and the
least recently used idle, unpinned ones are unloaded under a host memory budget.

Two servers: one without a budget (listing, racing first requests, cold starts, ensembles, BLS, the idle
time; it also measures one instance's footprint), and one whose budget holds three such instances (a
random workload over more models than fit, models in use and pinned ones never evicted, fail fast).
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all, wait_for
from tests.many_models import write_bls_model, write_ensemble, write_scale_model, write_scale_repo
from zinfer.client import AsyncClient
from zinfer.client.client import Client
from zinfer.client.errors import Cancelled, DeadlineExceeded, ResourceExhausted, ServerError, Unavailable

pytestmark = pytest.mark.integration

IDLE_S = 3.0
REPOS: dict[str, Path] = {}  # each server's repository, by its URL


def _x(v: float) -> dict[str, np.ndarray]:
    return {"X": np.full((1, 1), v, np.float32)}


def _y(client: Client, model: str, v: float) -> float:
    return float(client.infer(model, _x(v)).as_numpy("Y")[0, 0])


def _index(client: Client) -> dict[str, dict[str, object]]:
    return {r["name"]: r for r in client.repository_index()}


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + ("{" + want + "}" if labels else " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _loads_logged(server: ServerProcess, model: str) -> int:
    return len(re.findall(rf"event=model_loading model={model} ", server.log()))


def _evictions_logged(server: ServerProcess, model: str) -> int:
    return len(re.findall(rf"event=model_evicted model={model} ", server.log()))


# ------------------------------------------------------------------------------------ no budget


@pytest.fixture(scope="module")
def free_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("free") / "models"
    write_scale_repo(repo, 6)
    write_ensemble(repo, "chain", ("scale_2", "scale_3"))
    write_bls_model(repo, "bls_plus", "scale_5")
    write_scale_model(repo, 7)
    write_scale_model(repo, 8)
    (repo / "scale_7" / "1" / "W.npy").write_bytes(b"not an array")  # its load fails in the worker
    s = start_server(repo, "--model-control-mode", "on-demand", "--model-idle-unload", str(IDLE_S))
    REPOS[s.url] = repo
    try:
        yield s
    finally:
        stop_all([s])


def test_every_model_is_listed_before_any_loads(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        index = _index(client)
        assert set(index) == {f"scale_{k}" for k in range(1, 9)} | {"chain", "bls_plus"}
        assert index["scale_4"]["state"] == "UNAVAILABLE"
        assert index["scale_4"]["reason"] == "not loaded"
        assert index["scale_4"]["resident_bytes"] == 0
        # a client reads the metadata before its first request: answered without loading the model
        meta = client.model_metadata("scale_4")
        assert [t["name"] for t in meta["inputs"]] == ["X"]
        assert _index(client)["scale_4"]["state"] == "UNAVAILABLE"
        assert not client.is_model_ready("scale_4")
        assert client.is_server_ready()  # models not loaded yet do not make the server unready


def test_a_failed_load_answers_its_requests_and_leaves_the_server_ready(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        for _ in range(2):  # each request tries again
            with pytest.raises(Unavailable, match="model 'scale_7' failed to load"):
                client.infer("scale_7", _x(1))
        row = _index(client)["scale_7"]
        assert row["state"] == "UNAVAILABLE" and str(row["reason"]).startswith("failed to load: ")
        assert client.is_server_ready()
        assert _loads_logged(free_server, "scale_7") == 2
        assert _y(client, "scale_1", 5) == 5  # the others serve on


def test_racing_first_requests_start_one_load(free_server: ServerProcess) -> None:
    answers: list[float] = []
    errors: list[str] = []
    go = threading.Barrier(6)

    def first(i: int) -> None:
        try:
            with Client(free_server.url, timeout=60) as c:
                c.model_metadata("scale_1")
                go.wait(10)
                answers.append(_y(c, "scale_1", i) - i)  # scale_1: Y == X
        except Exception as exc:  # noqa: BLE001 - every failure is reported by the assert below
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=first, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert answers == [0.0] * 6
    assert _loads_logged(free_server, "scale_1") == 1
    metrics = _metrics(free_server)
    assert _sample(metrics, "zinfer_model_loads_total", model="scale_1", result="ok") == 1
    with Client(free_server.url, timeout=60) as client:
        row = _index(client)["scale_1"]
        assert row["state"] == "READY"
    wait_for(lambda: _sample(_metrics(free_server), "zinfer_model_resident_bytes", model="scale_1",
                             memory="host") > 1 << 20, 10, "scale_1's measured footprint")  # fmt: skip


def test_cold_start_is_measured_and_warm_requests_are_fast(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        client.model_metadata("scale_4")
        t0 = time.monotonic()
        assert _y(client, "scale_4", 3) == 12
        cold = time.monotonic() - t0
        t0 = time.monotonic()
        for v in range(20):
            assert _y(client, "scale_4", v) == 4 * v
        warm = (time.monotonic() - t0) / 20
    text = _metrics(free_server)
    count = _sample(text, "zinfer_model_cold_start_seconds_count")
    total = _sample(text, "zinfer_model_cold_start_seconds_sum")
    assert count >= 1 and total > 0
    logged = re.search(
        r"event=model_loaded_on_demand model=scale_4 cold_start_s=([0-9.]+)", free_server.log()
    )
    assert logged is not None
    assert 0 < float(logged.group(1)) <= cold
    assert warm < cold
    print(f"cold start scale_4: client {cold * 1000:.0f} ms, server {float(logged.group(1)) * 1000:.0f} ms; "
          f"warm request {warm * 1000:.2f} ms")  # fmt: skip


def test_a_request_waiting_for_its_load_can_be_cancelled(free_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(free_server.url, timeout=60) as c:
            await c.model_metadata("scale_6")
            task = asyncio.create_task(c.infer("scale_6", _x(1), request_id="w1"))
            for _ in range(500):
                if "w1" in c._active:
                    break
                await asyncio.sleep(0.01)
            await c.is_server_live()  # one connection's messages are handled in order: w1 is parked
            assert await c.cancel("w1")
            with pytest.raises(Cancelled):
                await task
            assert float((await c.infer("scale_6", _x(2))).as_numpy("Y")[0, 0]) == 12  # the load went on

    asyncio.run(main())


def test_a_model_added_to_the_repository_later_loads_on_its_first_request(free_server: ServerProcess) -> None:
    write_scale_model(REPOS[free_server.url], 11)
    with Client(free_server.url, timeout=60) as client:
        assert _y(client, "scale_11", 3) == 33
        with pytest.raises(ServerError, match="not found"):
            client.infer("no_such_model", _x(1))


def test_a_request_waits_for_the_load_only_within_its_timeout(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        client.model_metadata("scale_8")
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="while loading model.*scale_8"):
            client.infer("scale_8", _x(1), timeout=20_000)  # 20 ms: less than any load
        assert time.monotonic() - t0 < 5.0
        assert _y(client, "scale_8", 2) == 16  # the load went on; the next request is served
        assert _loads_logged(free_server, "scale_8") == 1


def test_an_ensemble_loads_its_steps_together(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        assert _y(client, "chain", 2) == 12  # scale_3(scale_2(2))
        index = _index(client)
        assert index["scale_2"]["state"] == "READY" and index["scale_3"]["state"] == "READY"


def test_a_bls_call_loads_its_target(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        assert _index(client)["scale_5"]["state"] == "UNAVAILABLE"
        assert _y(client, "bls_plus", 2) == 11  # scale_5(2) + 1
        assert _index(client)["scale_5"]["state"] == "READY"


def test_an_idle_model_is_unloaded_and_loads_again(free_server: ServerProcess) -> None:
    with Client(free_server.url, timeout=60) as client:
        assert _y(client, "scale_3", 1) == 3
        loads = _loads_logged(free_server, "scale_3")
        wait_for(lambda: _index(client)["scale_3"]["state"] == "UNAVAILABLE", IDLE_S + 20,
                 "scale_3 to be unloaded after its idle time")  # fmt: skip
        assert _index(client)["scale_3"]["reason"] == "evicted (idle); loads on its next request"
        assert "event=model_evicted model=scale_3 reason=idle" in free_server.log()
        assert (
            _sample(_metrics(free_server), "zinfer_model_evictions_total", model="scale_3", reason="idle")
            >= 1
        )
        assert _y(client, "scale_3", 2) == 6
        assert _loads_logged(free_server, "scale_3") == loads + 1


# ------------------------------------------------------------------------------------ a host budget

MODELS = 8  # scale_1 .. scale_8; scale_8 is pinned
SLOTS = 3.5  # the budget holds three instances (and half of one for measuring noise)


@pytest.fixture(scope="module")
def instance_bytes(free_server: ServerProcess) -> int:
    """One instance's measured footprint (worker RSS), from the server without a budget."""
    with Client(free_server.url, timeout=60) as client:
        assert _y(client, "scale_1", 1) == 1
        wait_for(lambda: int(_index(client)["scale_1"]["resident_bytes"]) > 1 << 20, 10,  # type: ignore[call-overload]
                 "scale_1's footprint")  # fmt: skip
        return int(_index(client)["scale_1"]["resident_bytes"])  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory: pytest.TempPathFactory, instance_bytes: int) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("budget") / "models"
    write_scale_repo(repo, MODELS, pinned=(MODELS,))
    for k in (9, 10):  # their requests wait 5 s in the queue: in use all that time
        write_scale_model(repo, k, hold_us=5_000_000, prefix="held")
    budget = int(SLOTS * instance_bytes)
    s = start_server(repo, "--model-control-mode", "on-demand", "--memory-budget", f"host={budget}")
    try:
        yield s
    finally:
        stop_all([s])


def test_a_random_workload_over_more_models_than_fit(
    budget_server: ServerProcess, instance_bytes: int
) -> None:
    rng = random.Random(35)
    plans = [[(rng.randint(1, MODELS), rng.randint(-50, 50)) for _ in range(30)] for _ in range(2)]
    done = [0, 0]
    errors: list[str] = []

    def run(i: int) -> None:
        with Client(budget_server.url, timeout=90) as c:
            for k, v in plans[i]:
                try:
                    y = _y(c, f"scale_{k}", v)
                    if y != k * v:
                        errors.append(f"scale_{k}({v}) = {y}, not {k * v}")
                except ServerError as exc:
                    errors.append(f"scale_{k}: {type(exc).__name__}: {exc}")
                done[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert done == [30, 30]  # every request answered, none lost
    text = _metrics(budget_server)
    evictions = sum(_sample(text, "zinfer_model_evictions_total", model=f"scale_{k}", reason="budget")
                    for k in range(1, MODELS + 1))  # fmt: skip
    loads = sum(_sample(text, "zinfer_model_loads_total", model=f"scale_{k}", result="ok")
                for k in range(1, MODELS + 1))  # fmt: skip
    assert evictions >= 1 and loads >= MODELS - 1
    assert _evictions_logged(budget_server, f"scale_{MODELS}") == 0  # pinned
    with Client(budget_server.url, timeout=60) as client:
        resident = [name for name, row in _index(client).items() if row["state"] == "READY"]
        assert len(resident) <= 3, resident
        status = client.server_status()["memory"]
        assert status["mode"] == "on-demand" and status["budget"]["host"] == int(SLOTS * instance_bytes)
        assert status["loads"] >= MODELS - 1 and status["evictions"] >= 1
    listed = subprocess.run([sys.executable, "-m", "zinfer.broker", "models", "--url", budget_server.url],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "RESIDENT" in listed.stdout.splitlines()[0]
    assert re.search(rf"scale_{MODELS} +1 +READY +[0-9.]+ MiB", listed.stdout), listed.stdout  # pinned
    assert "evicted (budget); loads on its next request" in listed.stdout
    print(
        f"random workload: {loads:.0f} loads, {evictions:.0f} evictions for 60 requests over {MODELS} models"
    )


def test_models_in_use_and_pinned_are_never_evicted_and_a_full_budget_fails_fast(
    budget_server: ServerProcess,
) -> None:
    held: dict[str, float] = {}
    errors: list[str] = []

    def hold(k: int) -> None:
        try:
            with Client(budget_server.url, timeout=90) as c:
                held[f"held_{k}"] = _y(c, f"held_{k}", 2)
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(f"held_{k}: {type(exc).__name__}: {exc}")

    with Client(budget_server.url, timeout=60) as client:
        assert _y(client, f"scale_{MODELS}", 1) == MODELS  # the pinned model is resident
        threads = [threading.Thread(target=hold, args=(k,)) for k in (9, 10)]
        for t in threads:
            t.start()
        wait_for(lambda: all(_index(client)[f"held_{k}"]["state"] == "READY" for k in (9, 10)), 60,
                 "both held models to load")  # fmt: skip
        # pinned + two models with queued requests fill the budget: nothing can make room
        t0 = time.monotonic()
        with pytest.raises(ResourceExhausted, match=r"host budget of .* no loaded model can be unloaded"):
            client.infer("scale_1", _x(1))
        assert time.monotonic() - t0 < 3.0  # fails fast, not after the held requests
        for t in threads:
            t.join(90)
        assert not errors, errors
        assert held == {"held_9": 18.0, "held_10": 20.0}
        for name in ("held_9", "held_10", f"scale_{MODELS}"):
            assert _evictions_logged(budget_server, name) == 0, name
        # now idle, the held models make room for the next load (the pinned one still stays)
        assert _y(client, "scale_1", 3) == 3
        assert _evictions_logged(budget_server, f"scale_{MODELS}") == 0
        assert _index(client)[f"scale_{MODELS}"]["state"] == "READY"
