"""Issue 30, item 2: seals added after hand-off, and any region a worker cannot reach, fail only the requests
that name that region, never the batch they share with other clients' requests.

The attack: hand over a memory file sealed only against shrinking, then add ``F_SEAL_WRITE`` (or
``F_SEAL_FUTURE_WRITE``): the worker's writable mapping fails with ``EPERM``. The server now requires
``F_SEAL_SEAL`` (with ``F_SEAL_SHRINK | F_SEAL_GROW``) at hand-off, so no seal can be added later; and a
worker that cannot map a region (whatever the reason) fails only the requests naming it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ServerProcess, wait_for
from tests.gated import gated_model, pending
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.errors import InvalidArgument
from zinfer.client.protocol import Command, OutputRequest, ShmRef, TensorRef
from zinfer.client.region_handoff import hand_over, handoff_path
from zinfer.client.worker_protocol import request_result_to_wire
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.signature import Signature
from zinfer.workers.batch import BatchRequest, run_batch
from zinfer.workers.kernels import AddKernel
from zinfer.workers.regions import RegionCache

pytestmark = pytest.mark.integration

F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("zinfer-cattacker", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.fixture
def handoff(bundled_server: ServerProcess) -> Iterator[Path]:
    path = handoff_path(bundled_server.url)
    assert path is not None
    yield path


@pytest.mark.parametrize(
    "seals",
    [
        fcntl.F_SEAL_SHRINK,  # the attack as reported: a write seal could be added after hand-off
        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW,  # still open to more seals
        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL,  # closed, but may grow behind the size registered
    ],
)
def test_attack_late_seals_a_memfd_open_to_more_seals_is_refused_at_hand_off(
    handoff: Path, seals: int
) -> None:
    fd = _memfd(4096, seals)
    try:
        with pytest.raises(InvalidArgument, match="F_SEAL_SHRINK \\| F_SEAL_GROW \\| F_SEAL_SEAL"):
            hand_over(handoff, fd, 10.0)
        if not seals & fcntl.F_SEAL_SEAL:  # what the attacker would have done next, had it been accepted
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    finally:
        os.close(fd)


def test_attack_late_seals_a_fully_sealed_memfd_is_accepted_and_takes_no_seal_later(
    handoff: Path, bundled_server: ServerProcess
) -> None:
    fd = _memfd(4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    raw = Raw(bundled_server.url)
    try:
        token = hand_over(handoff, fd, 10.0)
        assert raw.call(Command.REGISTER, {"name": "zinfer-csealed", "token": token}).status == 0
        for late in (fcntl.F_SEAL_WRITE, F_SEAL_FUTURE_WRITE):
            with pytest.raises(PermissionError):
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, late)
    finally:
        raw.close()
        os.close(fd)


# ---------------------------------------------------------------------------- the worker's side, in process

CONFIG = parse_model_config(
    """
    name: "m"
    backend: "zinfer"
    max_batch_size: 8
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "S" data_type: TYPE_FP32 dims: [ 2 ] } ]
    parameters { key: "kernel" value: { string_value: "add" } }
    """,
    source="test",
    model_name="m",
)
SIG = Signature.of(CONFIG)


def _wire(fd: int) -> tuple[int, int, int]:
    """The broker's view of a region: its descriptor (this process plays the broker), the file's identity."""
    st = os.fstat(fd)
    return fd, st.st_dev, st.st_ino


def _shm_request(rid: int, region: str, value_at: int, out_at: int) -> BatchRequest:
    refs = tuple(TensorRef(n, "FP32", (1, 2), shm=ShmRef(region, value_at, 8)) for n in ("A", "B"))
    return BatchRequest(rid, refs, (OutputRequest("S", ShmRef(region, out_at, 8)),))


def _inline_request(rid: int, frames: list[Any], value: float, slot: ShmRef | None = None) -> BatchRequest:
    refs = []
    for name in ("A", "B"):
        frames.append(np.full((1, 2), value, np.float32).tobytes())
        refs.append(TensorRef(name, "FP32", (1, 2), frame=len(frames) - 1))
    return BatchRequest(rid, tuple(refs), (OutputRequest("S", slot),))


@pytest.mark.parametrize("late_seal", [fcntl.F_SEAL_WRITE, F_SEAL_FUTURE_WRITE])
def test_attack_late_seals_a_region_the_worker_cannot_map_fails_only_its_requests(late_seal: int) -> None:
    """The victims' requests read and write their own region; the attacker's region (sealed only against
    shrinking, as an older server accepted) takes a write seal before the worker maps it: its requests fail,
    once as an input and once as an output slot only, and every victim's succeeds in the same batch."""
    victim = _memfd(4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    attacker = _memfd(4096, fcntl.F_SEAL_SHRINK)
    regions = RegionCache(owner=os.getpid())
    try:
        os.pwrite(victim, np.array([1, 2, 3, 4], np.float32).tobytes(), 0)
        regions.use_table({"zinfer-cvictim": _wire(victim), "zinfer-cattacker": _wire(attacker)})
        fcntl.fcntl(attacker, fcntl.F_ADD_SEALS, late_seal)  # after hand-off, before the batch runs
        frames: list[Any] = []
        requests = [
            _shm_request(1, "zinfer-cvictim", 0, 1024),
            _shm_request(2, "zinfer-cattacker", 0, 1024),  # reads the attacker's region
            _inline_request(3, frames, 5.0),
            _inline_request(4, frames, 7.0, slot=ShmRef("zinfer-cattacker", 2048, 8)),  # writes into it only
            _shm_request(5, "zinfer-cvictim", 0, 2048),
        ]
        out = run_batch(AddKernel(CONFIG, None), SIG, requests, frames, regions)  # type: ignore[arg-type]
        results = {r.id: request_result_to_wire(r) for r in out.results}
        assert sorted(results) == [1, 2, 3, 4, 5]
        for rid in (2, 4):
            assert results[rid]["status"] == protocol.Status.INVALID_ARGUMENT, results[rid]
            assert "cannot be mapped" in results[rid]["error"]
        for rid, at in ((1, 1024), (5, 2048)):
            assert results[rid]["status"] == 0, results[rid]
            np.testing.assert_array_equal(np.frombuffer(os.pread(victim, 8, at), np.float32), [2, 4])
        assert results[3]["status"] == 0, results[3]
        t = results[3]["outputs"][0]
        np.testing.assert_array_equal(np.frombuffer(out.frames[t["frame"]], np.float32), [10, 10])
    finally:
        regions.close()
        os.close(victim)
        os.close(attacker)


# ------------------------------------------------------------------------------- a live server

ONE = np.ones((1, 1), np.float32)


def _header(rid: str, slot: list[object] | None = None) -> dict[str, object]:
    return {
        "id": rid,
        "model": "g",
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 1], "frame": i}
            for i, n in enumerate(("INPUT_A", "INPUT_B"))
        ],
        "outputs": [{"name": "OUTPUT_SUM", **({"slot": slot} if slot else {})}],
    }


def _send(raw: Raw, command: Command, header: dict[str, object], frames: list[bytes] | None = None) -> None:
    raw.send([bytes(f) for f in protocol.encode(command, header, frames or [])])


def test_attack_late_seals_a_region_gone_between_registration_and_execution_fails_no_other_request(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A batch of three victims and one attacker runs (held open by the gated model); the attacker's output
    slot lies in a region it unregisters meanwhile (the broker closes its descriptor at once). Before the fix
    the worker mapped that region only to write the outputs, found it gone and failed the whole batch. Now
    every victim's request succeeds; the attacker's gets its outputs or a clear error, and the server serves
    on."""
    gate = gated_model(tmp_path, "g", max_batch_size=8)
    server = server_factory(tmp_path)
    attacker = Raw(server.url)
    victims = [Raw(server.url) for _ in range(3)]
    fd = _memfd(4096, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    path = handoff_path(server.url)
    assert path is not None
    try:
        token = hand_over(path, fd, 10.0)
        assert attacker.call(Command.REGISTER, {"name": "zinfer-cgone", "token": token}).status == 0
        with Client(server.url, timeout=30) as holder:
            held = threading.Thread(target=lambda: holder.infer("g", {"INPUT_A": ONE, "INPUT_B": ONE}))
            held.start()
            gate.wait_started(1)  # the instance is busy: what comes next queues, then goes as one batch
            for tag, raw in enumerate(victims, start=2):
                x = np.full((1, 1), tag, np.float32).tobytes()
                _send(raw, Command.INFER, _header(f"v{tag}"), [x, x])
            x = np.full((1, 1), 9, np.float32).tobytes()
            _send(attacker, Command.INFER, _header("a", ["zinfer-cgone", 0, 4]), [x, x])
            wait_for(lambda: pending(server, "g") == 4, 15, "the four requests to queue")
            gate.release(1)
            held.join(30)
            for tag in (2, 3, 4, 9):  # one instance, only tag 1 released: all four run in one batch
                gate.wait_started(tag)
            _send(attacker, Command.UNREGISTER, {"id": "u", "name": "zinfer-cgone"})
            assert attacker.reply().request_id == "u"  # the batch is still held: its answer comes later
            gate.release_all()
            for tag, raw in enumerate(victims, start=2):
                reply = raw.reply()
                assert reply.status == 0, f"victim {tag} failed: {reply.error}"
            reply = attacker.reply()
            assert reply.request_id == "a"
            assert reply.status == 0 or "shared-memory region" in reply.error, reply
            with Client(server.url, timeout=30) as after:  # the server and its worker serve on
                three = np.full((1, 1), 3, np.float32)
                assert (
                    after.infer("g", {"INPUT_A": three, "INPUT_B": three}).as_numpy("OUTPUT_SUM")[0, 0] == 6
                )
        assert "event=worker_exited" not in server.log()
    finally:
        gate.release_all()
        attacker.close()
        for raw in victims:
            raw.close()
        os.close(fd)
