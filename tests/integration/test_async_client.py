"""``AsyncClient`` over a real server: thousands in flight on one connection, timeouts, cancellation,
zero-copy arrays, and tritonclient-style requests for both clients."""

from __future__ import annotations

import asyncio
import shutil
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from tests.conftest import MODELS, TRITON_TIMING, ServerProcess, start_server, wait_for
from tests.gated import address, in_arena, shm_address
from tests.wire_spy import WireSpy
from zinfer.client import (
    AsyncClient,
    Client,
    ClientError,
    ConnectionFailed,
    InferInput,
    InferRequestedOutput,
    RequestTimeout,
)
from zinfer.client.errors import Cancelled, NotFound, Unavailable

pytestmark = pytest.mark.integration

T = TypeVar("T")
ONE = np.ones((1, 1), np.float32)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``wait_for`` off the event loop, so the client's own tasks keep running meanwhile."""
    await asyncio.to_thread(wait_for, condition, timeout, what)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def delayed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``delayed``: ``add`` whose batcher waits 3 s for a batch of 8, so a lone request sits in the queue."""
    repo = tmp_path_factory.mktemp("async")
    shutil.copytree(MODELS / "add", repo / "delayed")
    cfg = (repo / "delayed" / "config.pbtxt").read_text()
    cfg = cfg.replace('name: "add"', 'name: "delayed"').replace("max_batch_size: 16", "max_batch_size: 8")
    cfg = cfg.replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 3000000")
    (repo / "delayed" / "config.pbtxt").write_text(cfg + TRITON_TIMING)
    s = start_server(repo)
    yield s
    assert s.stop() == 0, s.log()


def _cancelled(server: ServerProcess, model: str) -> float:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("zinfer_requests_cancelled") and f'model="{model}"' in line)  # fmt: skip


def _executions(client: Client, model: str) -> int:
    return int(client.statistics(model)["model_stats"][0]["execution_count"])


# ---------------------------------------------------------------------------------------------- load


def test_2000_concurrent_requests_each_get_their_own_answer(bundled_server: ServerProcess) -> None:
    async def main() -> tuple[int, dict[int, int], int]:
        rng = np.random.default_rng(7)
        a = rng.standard_normal(2000).astype(np.float32)
        b = rng.standard_normal(2000).astype(np.float32)
        async with AsyncClient(bundled_server.url, timeout=120) as c:
            before = (await c.statistics("add"))["model_stats"][0]

            async def one(i: int) -> bool:
                r = await c.infer("add", {"INPUT_A": a[i : i + 1, None], "INPUT_B": b[i : i + 1, None]})
                return bool(r.as_numpy("OUTPUT_SUM")[0, 0] == a[i] + b[i])

            ok = await asyncio.gather(*(one(i) for i in range(2000)))
            after = (await c.statistics("add"))["model_stats"][0]
            assert not c._orphans and c._conn.in_flight == 0
        sizes = {s["batch_size"]: s["count"] for s in after["batch_stats"]}
        return sum(ok), sizes, after["inference_count"] - before["inference_count"]

    ok, sizes, count = run(main())
    assert ok == 2000
    assert count == 2000
    assert max(sizes) > 1, f"no batch larger than 1 formed: {sizes}"


def test_concurrent_requests_through_shared_memory(bundled_server: ServerProcess) -> None:
    """Every tensor in the arena (8 KiB each): slots reserved, read back and returned, none leaked."""

    async def main() -> None:
        async with AsyncClient(bundled_server.url, timeout=120, inline_threshold=-1) as c:

            async def one(i: int) -> None:
                x = np.full((1, 2048), i, np.float32)
                out = (await c.infer("identity", {"INPUT0": x})).as_numpy("OUTPUT0")
                assert out.shape == (1, 2048) and out[0, 0] == i and out[0, -1] == i

            await asyncio.gather(*(one(i) for i in range(300)))
            assert c._arena is not None and len(c._arena.segments) >= 1
            assert not c._orphans

    run(main())


# ---------------------------------------------------------------------------------------------- calls


def test_server_calls_match_the_sync_client(bundled_server: ServerProcess) -> None:
    async def main() -> None:
        with Client(bundled_server.url, timeout=30) as sync:
            async with AsyncClient(bundled_server.url, timeout=30) as c:
                assert await c.is_server_live() and await c.is_server_ready()
                assert await c.is_model_ready("add")
                assert not await c.is_model_ready("add", 99)
                assert await c.model_metadata("add") == sync.model_metadata("add")
                assert await c.get_model_metadata("add", "") == sync.get_model_metadata("add")
                assert (await c.model_config("linear"))["name"] == "linear"
                assert await c.get_model_config("linear") == sync.model_config("linear")
                assert "model_stats" in await c.statistics("add")
                assert "model_stats" in await c.get_inference_statistics("add")
                names = {r["name"] for r in await c.repository_index()}
                assert {"add", "identity", "linear"} <= names
                assert await c.get_model_repository_index() == sync.repository_index()
                assert {m["name"] for m in (await c.server_status())["models"]} >= {"add"}
                with pytest.raises(NotFound):
                    await c.model_metadata("no_such_model")
                with pytest.raises(NotFound):
                    await c.infer("no_such_model", {"X": ONE})
        with pytest.raises(ClientError, match="closed"):
            await c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})

    run(main())


def test_load_and_unload(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = tmp_path / "models"
    for name in ("add", "identity"):
        shutil.copytree(MODELS / name, repo / name)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")

    async def main() -> None:
        async with AsyncClient(server.url, timeout=60) as c:
            assert not await c.is_model_ready("identity")
            await c.load_model("identity")
            out = (await c.infer("identity", {"INPUT0": ONE})).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, ONE)
            await c.unload_model("identity")
            with pytest.raises(Unavailable):
                await c.infer("identity", {"INPUT0": ONE})

    run(main())


def test_survives_a_server_restart(server_factory: Callable[..., ServerProcess]) -> None:
    """A clear error while the server is gone, then the same client works again: its shared memory is
    registered anew with the new server."""
    first = server_factory()
    runtime = first.runtime_dir.parent

    async def add(c: AsyncClient) -> float:
        r = await c.infer("add", {"INPUT_A": ONE, "INPUT_B": ONE})
        return float(r.as_numpy("OUTPUT_SUM")[0, 0])

    async def main() -> None:
        async with AsyncClient(first.url, timeout=10, inline_threshold=-1) as c:
            assert await add(c) == 2.0
            assert first.stop() == 0
            with pytest.raises(ConnectionFailed):
                await add(c)
            server_factory(MODELS, runtime_dir=runtime)
            assert await add(c) == 2.0
            assert not c._orphans

    run(main())


# ---------------------------------------------------------------------------------------------- zero copy


def test_zero_copy_empty_arrays(bundled_server: ServerProcess) -> None:
    """``empty()``/``zeros()`` arrays go as descriptors of their own bytes (addresses compared, as the wire
    named them: ``WireSpy``), outputs come back as views of the arena."""

    async def main(sent: WireSpy) -> None:
        async with AsyncClient(sent.url, timeout=60) as c:
            x = c.empty((1, 1 << 18))  # no await: its segment is registered before the next send
            x[:] = np.arange(1 << 18, dtype=np.float32)
            out = (await c.infer("identity", {"INPUT0": x})).as_numpy("OUTPUT0")
            ref = sent.input("INPUT0")
            assert ref.shm is not None and shm_address(c, ref.shm.region, ref.shm.offset) == address(x)
            np.testing.assert_array_equal(out, x)
            assert in_arena(c, out)
            big = c.zeros((1, 6 << 20))  # 24 MiB: a second, larger segment
            big[0, -1] = 5.0
            assert c._arena is not None and len(c._arena.segments) == 2
            out = (await c.infer("identity", {"INPUT0": big})).as_numpy("OUTPUT0")
            ref = sent.input("INPUT0")
            assert ref.shm is not None and shm_address(c, ref.shm.region, ref.shm.offset) == address(big)
            assert out.shape == big.shape and out[0, -1] == 5.0 and out[0, 0] == 0.0
            assert in_arena(c, out)
            assert not c._unregistered

    with WireSpy(bundled_server.url) as spy:
        run(main(spy))


# ---------------------------------------------------------------------------------------------- cancel


def test_empty_arrays_sent_again_and_again_reuse_the_arena(bundled_server: ServerProcess) -> None:
    """40 requests of a fresh 4 MiB ``empty()`` array each through a 16 MiB arena: each array's slot comes
    back once its request is answered and the array is gone (it used to stay taken: the fifth failed)."""

    async def main() -> None:
        async with AsyncClient(
            bundled_server.url, timeout=60, arena_bytes=8 << 20, max_arena_bytes=16 << 20
        ) as c:
            for i in range(40):
                x = c.empty((1, 1 << 20))
                x[:] = float(i)
                out = (await c.infer("identity", {"INPUT0": x})).as_numpy("OUTPUT0")
                assert out[0, 0] == float(i) and out[0, -1] == float(i)
                del x, out
            assert not c._orphans

    run(main())


def test_client_timeout_cancels_in_the_server(delayed_server: ServerProcess) -> None:
    before = _cancelled(delayed_server, "delayed")

    async def main() -> None:
        async with AsyncClient(delayed_server.url, timeout=30, inline_threshold=-1) as c:
            with pytest.raises(RequestTimeout):
                await c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}, client_timeout=0.2)
            await until(lambda: not c._orphans, 10, "the late reply (Cancelled) to return the slots")

    run(main())
    wait_for(lambda: _cancelled(delayed_server, "delayed") > before, 10, "the server to count it")
    with Client(delayed_server.url) as sync:
        assert _executions(sync, "delayed") == 0


def test_cancelling_the_task_removes_the_queued_request(delayed_server: ServerProcess) -> None:
    before = _cancelled(delayed_server, "delayed")

    async def main() -> None:
        async with AsyncClient(delayed_server.url, timeout=30, inline_threshold=-1) as c:
            await c.model_metadata("delayed")
            task = asyncio.create_task(c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}))
            await until(lambda: bool(c._orphans), 10, "the request to be sent, its slots reserved")
            await c.is_server_live()  # one connection's messages are handled in order: the infer is queued
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if c._orphans:  # the server may still use the slots until it answers
                assert len(c._orphans) == 1
            else:  # already released: only the server's answer to the cancel may have done that
                await until(lambda: _cancelled(delayed_server, "delayed") > before, 10, "the server's answer")
            await until(lambda: not c._orphans, 10, "the late reply to release them")
            # the connection is still good
            r = await c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}, timeout=1)
            assert r.as_numpy("OUTPUT_SUM")[0, 0] == 2.0

    run(main())
    wait_for(lambda: _cancelled(delayed_server, "delayed") > before, 10, "the server to count it")


def test_cancel_by_request_id(delayed_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncClient(delayed_server.url, timeout=30) as c:
            await c.model_metadata("delayed")
            task = asyncio.create_task(c.infer("delayed", {"INPUT_A": ONE, "INPUT_B": ONE}, request_id="r1"))
            await until(lambda: "r1" in c._active, 10, "r1 to be sent")
            await c.is_server_live()  # one connection's messages are handled in order: r1 is queued
            assert await c.cancel("r1")
            with pytest.raises(Cancelled):
                await task
            assert not await c.cancel("r1")  # no longer in flight

    run(main())


# ---------------------------------------------------------------------------------------------- triton


def _triton_inputs() -> list[InferInput]:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    inputs = [InferInput("INPUT0", [2, 4], "FP32"), InferInput("INPUT1", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _check_triton_result(result: Any) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    assert result.get_output("OUTPUT1") is None  # not requested
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4]}
    resp = result.get_response()
    assert resp["model_name"] == "add_sub_triton" and resp["id"] == "t-1"
    assert [o["name"] for o in resp["outputs"]] == ["OUTPUT0"]


def test_tritonclient_style_code_runs_on_both_clients(bundled_server: ServerProcess) -> None:
    outputs = [InferRequestedOutput("OUTPUT0")]
    with Client(bundled_server.url, timeout=60) as client:
        result = client.infer("add_sub_triton", _triton_inputs(), outputs=outputs, request_id="t-1")
        _check_triton_result(result)
        text = InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a b"], [b"c"]], dtype=object))
        out = client.infer("text_upper", [text], model_version="1")
        assert out.as_numpy("UPPER").ravel().tolist() == [b"A B", b"C"]
        assert out.get_output("UPPER") == {"name": "UPPER", "datatype": "BYTES", "shape": [2, 1]}

    async def main() -> None:
        async with AsyncClient(bundled_server.url, timeout=60) as c:
            result = await c.infer("add_sub_triton", _triton_inputs(), outputs=outputs, request_id="t-1")
            _check_triton_result(result)
            with pytest.raises(ClientError, match="no data"):
                await c.infer("add_sub_triton", [InferInput("INPUT0", [1, 4], "FP32")])

    run(main())
