"""Every configuration error of ``zinfer serve`` exits 2 with a message naming it, so that systemd's
``RestartPreventExitStatus=2`` (systemd/zinfer.service) stops a unit that no restart can fix; a failure
that a restart may fix (another server on the runtime directory) exits 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import MODELS, ServerProcess

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    """``zinfer serve`` on the bundled models (another ``--model-repository`` in ``args`` wins)."""
    return subprocess.run(
        [sys.executable, "-m", "zinfer.broker", "serve", "--no-metrics", "--model-repository", str(MODELS),
         *args],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _writable_by_others(tmp: Path) -> list[str]:
    rt = tmp / "rt"
    rt.mkdir()
    os.chmod(rt, 0o777)
    return ["--runtime-dir", str(rt)]


def _symlink(tmp: Path) -> list[str]:
    (tmp / "target").mkdir()
    (tmp / "rt").symlink_to(tmp / "target")
    return ["--runtime-dir", str(tmp / "rt")]


def _config_file(tmp: Path) -> list[str]:
    (tmp / "zinfer.toml").write_text("colour = 1\n")
    return ["--config", str(tmp / "zinfer.toml")]


# (id, arguments given a temp folder (with --runtime-dir <folder>/rt unless they name one), what stderr says)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("unknown-flag", lambda t: ["--no-such-flag"], "unrecognized arguments"),
    ("negative-max-tensor-bytes", lambda t: ["--max-tensor-bytes", "-1"],
     "--max-tensor-bytes: must be >= 1"),
    ("zero-heartbeat", lambda t: ["--heartbeat-interval", "0"],
     "--heartbeat-interval: must be > 0"),
    ("unknown-config-key", _config_file, "colour"),
    ("missing-repository", lambda t: ["--model-repository", str(t / "nope")],
     "event=bad_repository"),
    ("missing-socket-group", lambda t: ["--socket-group", "zinfer-no-such-group"],
     "no group named 'zinfer-no-such-group'"),
    ("runtime-dir-writable-by-others", _writable_by_others, "writable by group or others"),
    ("runtime-dir-symlink", _symlink, "is a symbolic link"),
    ("runtime-dir-too-long", lambda t: ["--runtime-dir", str(t / ("d" * 120))], "longer than 107 characters"),
    ("tcp-without-curve", lambda t: ["--tcp", f"0.0.0.0:{_free_port()}"],
     "without CURVE"),
    ("missing-curve-key", lambda t: ["--tcp", f"127.0.0.1:{_free_port()}", "--curve-secret-key",
                                     str(t / "none.key_secret")],
     "--curve-secret-key"),
    ("bad-rate-limit-resource", lambda t: ["--rate-limit-resource", "gpu-mem"],
     "--rate-limit-resource"),
    ("bad-rate-limit-device", lambda t: ["--rate-limit-resource", "r:1:tpu"],
     "not a device"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says"), [pytest.param(a, s, id=i) for i, a, s in CASES])
def test_every_configuration_error_exits_2(
    args: Callable[[Path], list[str]], says: str, tmp_path: Path
) -> None:
    given = args(tmp_path)
    if "--runtime-dir" not in given:
        given += ["--runtime-dir", str(tmp_path / "rt")]
    done = _serve(*given)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_second_server_on_the_same_runtime_dir_exits_1_not_2(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Not a configuration error: the unit may restart once the other server is gone."""
    first = server_factory(MODELS)
    done = _serve("--runtime-dir", str(first.runtime_dir))
    assert done.returncode == 1, done.stderr
    assert "another zinfer server is running" in done.stderr
