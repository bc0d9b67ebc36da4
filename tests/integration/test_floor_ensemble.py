"""The c32 floor of ``bench/floor_ensemble.py`` still speaks zinfer's wire: a short turn of each floor level,
real processes on ipc sockets, every warm-up answer and the last answer under load checked by the turn
itself (it exits non-zero on a wrong one), and each process's CPU counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("level", "load", "roles"),
    [
        ("floor-add", "add", ("broker", "add", "client")),
        ("floor-ens", "ens", ("broker", "tokenizer", "lm", "detokenizer", "client")),
        ("floor-ens1", "ens", ("broker", "tokenizer", "lm", "detokenizer", "client")),
    ],
)
def test_floor_turn_answers_right_and_counts_every_process(
    level: str, load: str, roles: tuple[str, ...]
) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "floor_ensemble.py"), "--child", level, "0.3", "none"],
        capture_output=True, text=True, timeout=180, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])[load]
    assert out["requests"] > 32 and out["rate_s"] > 0 and out["p50_us"] > 0
    for role in roles:
        assert out[f"{role}_us"] > 0, (role, out)
    assert out["wakes_per_request"] > 0
