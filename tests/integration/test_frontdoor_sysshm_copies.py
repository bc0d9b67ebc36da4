"""A tensor in a caller's system shared memory crosses the HTTP door with one copy each way (``pread`` and
``pwrite``, or a ``memcpy`` through the segment's mapping where the ``_shmcopy`` helper is built): the
input is read straight into the bridge's arena and goes to the broker as a descriptor of it, not as a
frame; the output is reserved in the arena, but the identity model's output is its input, unchanged, so the
worker names the input's range instead (the request allows it: its input is the door's own arena array),
and the output is written into the caller's region straight from that input, with no copy in the worker.
The door runs in this process (``HttpFrontDoor`` on a real ``zinfer serve``), so what it hands the broker
and the kernel can be looked at. With the helper (built here where the install has none), both copies are
``memcpy`` calls made off the door's event loop (``copy_pool``)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from tests.conftest import ServerProcess, start_server, stop_all
from tests.frontdoor_helpers import repository
from tests.shmcopy_build import load_helper, shmcopy_helper

pytestmark = pytest.mark.integration

N = 256 * 1024  # FP32 items: 1 MiB, far over the bridge's inline threshold


# a Triton-style model.py whose output is its input's array (bench/vs_triton_repo.py's ``big``)
_PY_ECHO_CONFIG = """name: "pyecho"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
_PY_ECHO_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = repository(tmp_path_factory.mktemp("fdc"), ("identity",))
    (repo / "pyecho" / "1").mkdir(parents=True)
    (repo / "pyecho" / "config.pbtxt").write_text(_PY_ECHO_CONFIG)
    (repo / "pyecho" / "1" / "model.py").write_text(_PY_ECHO_MODEL)
    s = start_server(repo)
    try:
        yield s
    finally:
        stop_all([s])


def _body(region: str, nbytes: int) -> bytes:
    params = {"shared_memory_region": region, "shared_memory_byte_size": nbytes}
    return json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, N], "parameters": params}],
        "outputs": [{"name": "OUTPUT0", "parameters": {**params, "shared_memory_offset": nbytes}}],
    }).encode()  # fmt: skip


async def _run(
    url: str, monkeypatch: pytest.MonkeyPatch, helper: Path | None, model: str = "identity"
) -> dict[str, Any]:
    from zinfer.frontdoor import sysshm
    from zinfer.frontdoor.bridge import Bridge
    from zinfer.frontdoor.door import FrontDoor, FrontDoorOptions
    from zinfer.frontdoor.http_server import HttpFrontDoor
    from zinfer.frontdoor.http_wire import HttpRequest
    from zinfer.frontdoor.sysshm_maps import SegmentMaps

    seen: dict[str, Any] = {"preads": [], "pwrites": [], "threads": set()}
    real_read, real_write = SegmentMaps.read, SegmentMaps.write
    real_later_read, real_later_write = SegmentMaps.later_read, SegmentMaps.later_write

    def traced(copy: Any) -> Any:
        def run() -> bool:
            seen["threads"].add(threading.get_ident())
            return bool(copy())

        return run

    def later_read(maps: SegmentMaps, ident: Any, fd: int, start: int, out: memoryview) -> Any:
        copy = real_later_read(maps, ident, fd, start, out)
        if copy is not None:
            seen["preads"].append([out])
        return None if copy is None else traced(copy)

    def later_write(maps: SegmentMaps, ident: Any, fd: int, start: int, data: memoryview) -> Any:
        copy = real_later_write(maps, ident, fd, start, data)
        if copy is not None:
            seen["pwrites"].append(data)
        return None if copy is None else traced(copy)

    def read(maps: SegmentMaps, ident: Any, fd: int, start: int, out: memoryview) -> bool:
        seen["preads"].append([out])
        return real_read(maps, ident, fd, start, out)

    def write(maps: SegmentMaps, ident: Any, fd: int, start: int, data: memoryview) -> bool:
        seen["pwrites"].append(data)
        return real_write(maps, ident, fd, start, data)

    monkeypatch.setattr(SegmentMaps, "read", read)  # one copy each: a pread/pwrite, or a mapped memcpy
    monkeypatch.setattr(SegmentMaps, "write", write)
    monkeypatch.setattr(SegmentMaps, "later_read", later_read)  # or later, off the loop
    monkeypatch.setattr(SegmentMaps, "later_write", later_write)
    nbytes = N * 4
    key = f"/fdcopy_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fdc", key, 2 * nbytes)
    with tempfile.TemporaryDirectory(prefix="zfdc-") as tmp:
        bridge = Bridge(url)
        folder = Path(tmp) / "shm"
        door = FrontDoor(FrontDoorOptions(url, folder), bridge, sysshm.SystemShm(folder))
        if helper is not None:
            door.shm._maps = SegmentMaps(load_helper(helper))
        seen["loop_thread"] = threading.get_ident()
        client = bridge._client
        exchange = client._exchange

        async def spy(p: Any, timeout: float | None) -> Any:
            seen["prepared"] = p
            reply, frames = await exchange(p, timeout)
            seen["reply_frames"] = list(frames)
            seen["reply"] = reply
            return reply, frames

        monkeypatch.setattr(client, "_exchange", spy)
        try:
            data = np.arange(N, dtype=np.float32)
            shm.set_shared_memory_region(handle, [data])
            handler = HttpFrontDoor(door)
            uid = os.getuid()
            register = json.dumps({"key": key, "offset": 0, "byte_size": 2 * nbytes}).encode()
            answer = await handler.handle(HttpRequest(
                "POST", "/v2/systemsharedmemory/region/fdc/register", {}, register, None, uid))  # fmt: skip
            assert answer.status == 200, answer
            answer = await handler.handle(HttpRequest(
                "POST", f"/v2/models/{model}/infer", {}, _body("fdc", nbytes), None, uid))  # fmt: skip
            assert answer.status == 200, b"".join(answer.body)
            seen["answer"] = b"".join(answer.body)
            (kept,) = seen["prepared"].keep
            seen["written_from_input"] = [  # while the arena is mapped
                np.shares_memory(np.frombuffer(w, np.uint8), kept) for w in seen["pwrites"]
            ]
            seen["result"] = shm.get_contents_as_numpy(handle, np.float32, [N], offset=nbytes).copy()
        finally:
            await bridge.close()
            shm.destroy_shared_memory_region(handle)
    return seen


@pytest.mark.parametrize("mapped", [False, True], ids=["installed", "mapped"])
def test_system_shm_crosses_the_door_with_one_copy_each_way(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mapped: bool
) -> None:
    helper = shmcopy_helper(tmp_path) if mapped else None
    if mapped and helper is None:
        pytest.skip("no C compiler or Python headers to build frontdoor/_shmcopy.c")
    seen = asyncio.run(_run(server.url, monkeypatch, helper))
    np.testing.assert_array_equal(seen["result"], np.arange(N, dtype=np.float32))
    assert b'"data"' not in seen["answer"] and b"binary_data_size" not in seen["answer"]
    p = seen["prepared"]
    # the input: one pread, into an arena slot, sent to the broker as that slot's descriptor (no frame)
    assert len(seen["preads"]) == 1
    (ref,) = p.header.inputs
    assert ref.shm is not None and ref.shm.nbytes == N * 4 and ref.frame is None
    assert not [f for f in p.frames if len(memoryview(f)) >= N]  # no tensor bytes inline
    (buf,) = seen["preads"][0]
    read_into = np.frombuffer(buf, np.uint8)
    assert any(np.shares_memory(read_into, a) for a in p.keep)  # the array the request names
    # the output: reserved in the arena, which the request lets it alias its inputs; not sent back inline
    (out,) = p.header.outputs
    assert out.slot is not None and out.slot.nbytes >= N * 4 and out.alias
    assert not [f for f in seen["reply_frames"] if len(memoryview(f)) >= N]
    # the worker named the input's own range (the identity output is the input), not the slot
    (named,) = seen["reply"].body["outputs"]
    assert named["shm"] == [ref.shm.region, ref.shm.offset, N * 4]
    # ... and one pwrite into the caller's region, straight from the input's array
    assert len(seen["pwrites"]) == 1
    assert seen["written_from_input"] == [True]
    if mapped:  # both memcpy calls ran on the door's copy pool, not on its event loop
        assert len(seen["threads"]) >= 1 and seen["loop_thread"] not in seen["threads"]


def test_a_python_model_returning_its_input_is_not_copied_in_the_worker(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = asyncio.run(_run(server.url, monkeypatch, None, "pyecho"))
    np.testing.assert_array_equal(seen["result"], np.arange(N, dtype=np.float32))
    (ref,) = seen["prepared"].header.inputs
    (named,) = seen["reply"].body["outputs"]
    assert named["shm"] == [ref.shm.region, ref.shm.offset, N * 4]  # the input's own range, not the slot
    assert seen["written_from_input"] == [True]
