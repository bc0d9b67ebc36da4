"""The shared fixtures clean up unconditionally: one server failing to stop leaves no other running."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import ServerProcess, stop_all


class _FakeServer:
    def __init__(self, tmp: Path, name: str, fails: bool, stopped: list[str]) -> None:
        self.runtime_dir = tmp / name / "rt"
        self.runtime_dir.mkdir(parents=True)
        self.log_path = tmp / f"{name}.log"
        self.log_path.write_text("")
        self.name, self.fails, self.stopped = name, fails, stopped

    def stop(self) -> int:
        self.stopped.append(self.name)
        if self.fails:
            raise AssertionError(f"{self.name} did not stop cleanly")
        return 0


def test_stop_all_stops_every_server_when_some_fail(tmp_path: Path) -> None:
    stopped: list[str] = []
    fakes = [_FakeServer(tmp_path, n, n in ("a", "c"), stopped) for n in ("a", "b", "c")]
    with pytest.raises(AssertionError, match="a did not stop") as info:
        stop_all(cast(list[ServerProcess], cast(Any, fakes)))
    assert stopped == ["a", "b", "c"]
    assert any("c did not stop" in note for note in info.value.__notes__)
    assert not any(f.runtime_dir.parent.exists() or f.log_path.exists() for f in fakes)
