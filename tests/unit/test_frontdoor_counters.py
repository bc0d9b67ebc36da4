"""The front door's request counters: recorded on the loop, copied there, written elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

from zinfer.frontdoor.door import Counters


def test_counts_per_protocol_ok_and_failed() -> None:
    c = Counters()
    for ok in (True, True, False):
        c.record("http", ok)
    c.record("grpc", True)
    snap = c.snapshot()
    assert snap["requests"] == {"http": {"ok": 2, "failed": 1}, "grpc": {"ok": 1, "failed": 0}}
    assert snap["pid"] == os.getpid() and snap["started"] == c.started


def test_a_snapshot_does_not_move_with_later_requests(tmp_path: Path) -> None:
    c = Counters()
    c.record("http", True)
    snap = c.snapshot()
    c.record("http", True)  # while a thread writes the snapshot, the loop records on
    c.record("grpc", False)
    path = tmp_path / "0.json"
    Counters.write(path, snap)
    assert json.loads(path.read_text()) == {**snap, "requests": {"http": {"ok": 1, "failed": 0}}}
    assert not path.with_suffix(".tmp").exists()
    assert c.snapshot()["requests"] == {"http": {"ok": 2, "failed": 0}, "grpc": {"ok": 0, "failed": 1}}
