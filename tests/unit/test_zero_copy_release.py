"""Arrays made by ``empty()`` live in the client's arena: their slot goes back when the last array over it
is gone (it used to stay taken for good, so a client sending ``empty()`` arrays filled its arena), and not
before: a request that names one keeps it alive while the server may still read it."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest

from zinfer.client.base import _ClientBase, _ModelInfo, _OutputSpec
from zinfer.client.errors import ResourceExhausted
from zinfer.client.shm import Segment

MIB = 1 << 20


class _Offline(_ClientBase):
    """The arena and request building of either client, with no server."""

    def _on_new_segment(self, seg: Segment) -> None:
        pass


@pytest.fixture
def client() -> Iterator[_ClientBase]:
    c = _Offline(
        f"ipc:///tmp/zinfer-zero-copy-test-{os.getpid()}.sock",  # never connected: nothing is sent
        timeout=5.0, shm=True, arena_bytes=8 * MIB, max_arena_bytes=16 * MIB, inline_threshold=4096,
    )  # fmt: skip
    yield c
    if c._arena is not None:
        c._arena.close()


def _used(c: _ClientBase) -> int:
    assert c._arena is not None
    return sum(seg.size - sum(free.sizes) for seg, free in c._arena._segments)


def test_a_dropped_empty_array_gives_its_slot_back(client: _ClientBase) -> None:
    for _ in range(40):  # 40 x 4 MiB through a 16 MiB arena: only possible if each slot comes back
        x = client.empty((MIB,), np.float32)
        x[:] = 1.0
        view = x[: MIB // 2]  # a view keeps the slot as long as it lives
        del x
        assert _used(client) >= 4 * MIB
        del view
    gc.collect()
    assert _used(client) == 0


def test_a_request_keeps_the_empty_array_it_names_until_settled(client: _ClientBase) -> None:
    info = _ModelInfo("m", 1, 0, (_OutputSpec("Y", "BYTES", (1,)),))
    x = client.empty((MIB,), np.float32)
    p = client._prepare(info, {"X": x}, None, None, 0, None)
    assert p.header.inputs[0].shm is not None and p.slots == []  # sent where it is, no copy
    client._track(p, "r1")
    del x  # the caller gave up on it while the server may still read it
    gc.collect()
    assert _used(client) >= 4 * MIB
    client._late_reply("r1")  # the server is done with the request
    del p
    gc.collect()
    assert _used(client) == 0
    with pytest.raises(ResourceExhausted):
        keep = [client.empty((MIB,), np.float32) for _ in range(5)]  # 20 MiB live: over the 16 MiB cap
        del keep
