"""Property: whatever a client does with REGISTER, UNREGISTER, re-registration and its own segments (shrink
attempts, hole punching, planting names in /dev/shm, dropping them), every answer is either the right one or a
clear error, and the server keeps serving everyone."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ServerProcess
from tests.raw_client import Raw
from zinfer.client import protocol
from zinfer.client.client import Client
from zinfer.client.protocol import Command
from zinfer.client.shm import SHM_DIR, Segment

pytestmark = pytest.mark.integration

NAMES = ("zinfer-cprop0", "zinfer-cprop1", "zinfer-cprop2")
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

ops = st.lists(
    st.tuples(
        st.sampled_from(["register", "unregister", "request", "foreign", "punch", "shrink", "plant", "drop"]),
        st.sampled_from(NAMES),
        st.floats(-1e6, 1e6, width=32),
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def client(bundled_server: ServerProcess) -> Iterator[Client]:
    with Client(bundled_server.url, timeout=30) as c:
        yield c


def _header(name: str) -> dict[str, object]:
    return {
        "model": "identity",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "shm": [name, 0, 16]}],
        "outputs": [{"name": "OUTPUT0", "slot": [name, 2048, 16]}],
    }


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
def test_any_interleaving_gives_right_answers_or_clear_errors(
    bundled_server: ServerProcess, client: Client, tmp_path: Path, steps: list[tuple[str, str, float]]
) -> None:
    raw, other = Raw(bundled_server.url), Raw(bundled_server.url)
    segs: dict[str, Segment] = {}  # what this connection registered under each name (and still maps)
    dropped: list[Segment] = []
    planted: list[Path] = []
    try:
        for op, name, value in steps:
            seg = segs.get(name)
            if op == "register":
                new = Segment.create_sealed(4096, name=name)
                reply = raw.register(new)
                assert reply.status == protocol.Status.OK, reply.error
                if seg is not None:
                    dropped.append(seg)
                segs[name] = new
            elif op == "unregister":
                reply = raw.call(Command.UNREGISTER, {"name": name})
                if seg is None:
                    assert reply.status == protocol.Status.NOT_FOUND
                else:
                    assert reply.status == protocol.Status.OK, reply.error
                    dropped.append(segs.pop(name))
            elif op in ("request", "foreign"):
                if seg is not None:
                    np.frombuffer(seg.buf, np.float32, count=4)[:] = value
                    np.frombuffer(seg.buf, np.float32, count=4, offset=2048)[:] = np.nan
                reply = (raw if op == "request" else other).call(Command.INFER, _header(name))
                if op == "request" and seg is not None:
                    assert reply.status == protocol.Status.OK, reply.error
                    out = np.frombuffer(seg.buf, np.float32, count=4, offset=2048)
                    np.testing.assert_array_equal(out, value)
                else:
                    assert reply.status == protocol.Status.INVALID_ARGUMENT
                    assert "not registered" in reply.error and name not in reply.error
            elif op == "punch" and seg is not None:
                _libc.fallocate(seg.fd, 0x03, ctypes.c_long(0), ctypes.c_long(4096))  # PUNCH_HOLE|KEEP_SIZE
            elif op == "shrink" and seg is not None:
                with pytest.raises(PermissionError):
                    os.ftruncate(seg.fd, 8)
            elif op == "plant" and not (SHM_DIR / name).exists():
                target = tmp_path / f"target-{len(planted)}"
                target.write_bytes(b"\x00" * 4096)
                os.symlink(target, SHM_DIR / name)
                planted.append(SHM_DIR / name)
            elif op == "drop" and seg is not None:
                dropped.append(segs.pop(name))  # the client forgets it without telling the server
                raw.call(Command.UNREGISTER, {"name": name})
        x = np.ones((1, 4), np.float32)
        np.testing.assert_array_equal(client.infer("identity", {"INPUT0": x}).as_numpy("OUTPUT0"), x)
    finally:
        for name in segs:
            raw.call(Command.UNREGISTER, {"name": name})
        raw.close()
        other.close()
        for seg in [*segs.values(), *dropped]:
            seg.close()
        for link in planted:
            link.unlink(missing_ok=True)
