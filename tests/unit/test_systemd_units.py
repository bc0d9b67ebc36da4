"""The systemd files: what the unit must say, and systemd's own checks (skipped, with the reason, where
systemd's tools are not installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zinfer.broker.server_config import load_config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "zinfer.service"
SYSUSERS = ROOT / "systemd" / "zinfer.sysusers"
EXAMPLE = ROOT / "configs" / "zinfer.toml"
INSTALLED_ZINFER = "/opt/zinfer/bin/zinfer"


def _unit() -> dict[str, dict[str, list[str]]]:
    """Sections of the unit, each key with every value it is given (in order)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", value)
    assert m, f"not a plain time span: {value}"
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_the_unit_notifies_restarts_and_stops_cleanly() -> None:
    service = _unit()["Service"]
    one = {key: values[-1] for key, values in service.items()}
    assert one["Type"] == "notify"
    assert one["NotifyAccess"] == "main"
    assert _seconds(one["WatchdogSec"]) >= 10
    assert one["Restart"] == "on-failure"
    assert one["KillMode"] == "mixed"
    assert one["RuntimeDirectory"] == "zinfer"
    assert one["RuntimeDirectoryMode"] == "0750"
    assert (one["User"], one["Group"]) == ("zinfer", "zinfer")
    assert "RemoveIPC" in one
    config = load_config(EXAMPLE)
    assert _seconds(one["TimeoutStopSec"]) > config["drain_timeout_s"] + config["exit_timeout_s"] + 4
    exec_start = one["ExecStart"].split()
    assert exec_start[:2] == [INSTALLED_ZINFER, "serve"]
    assert exec_start[exec_start.index("--runtime-dir") + 1] == "/run/" + one["RuntimeDirectory"]
    assert exec_start[exec_start.index("--config") + 1] == "/etc/zinfer/zinfer.toml"
    assert config["socket_group"] in one["SupplementaryGroups"].split()


def test_the_unit_keeps_gpu_devices_reachable() -> None:
    service = _unit()["Service"]
    for key in ("PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock", "MemoryDenyWriteExecute",
                "ProcSubset"):  # fmt: skip
        assert key not in service, f"{key}= would shut the workers out of /dev/nvidia* or CUDA"
    assert service["ProtectSystem"] == ["strict"]  # leaves /dev (and so /dev/shm) writable


def test_sysusers_declares_the_unit_user_and_socket_group() -> None:
    lines = [line.split() for line in SYSUSERS.read_text().splitlines() if line and not line.startswith("#")]
    assert ["g", "zinfer-clients", "-"] in lines
    assert ["m", "zinfer", "zinfer-clients"] in lines
    assert any(line[:2] == ["u", "zinfer"] for line in lines)


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """``systemd-analyze verify`` on the unit, with ExecStart pointed at this checkout's ``zinfer`` (verify
    insists that the program exists); it must print nothing at all, since unknown keys and bad values are
    only warnings to it."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd); the unit was not verified")
    zinfer = Path(sys.executable).parent / "zinfer"
    if not zinfer.exists():
        pytest.skip(f"no zinfer entry point beside {sys.executable} to stand in for {INSTALLED_ZINFER}")
    unit = tmp_path / "zinfer.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED_ZINFER, str(zinfer)))
    done = subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0 and "Failed to initialize manager" in output:  # pragma: no cover
        pytest.skip(f"systemd-analyze cannot run here: {output}")
    assert done.returncode == 0 and not output, output


def test_systemd_analyze_verify_catches_mistakes(tmp_path: Path) -> None:
    """The check above is worth something: a misspelt key makes verify speak."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = tmp_path / "bad.service"
    unit.write_text("[Service]\nTpye=notify\nExecStart=/bin/true\n")
    done = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    assert "Tpye" in done.stdout + done.stderr


def test_systemd_sysusers_creates_them(tmp_path: Path) -> None:
    tool = shutil.which("systemd-sysusers")
    if tool is None:
        pytest.skip("systemd-sysusers is not installed (apt-get install systemd); sysusers file not checked")
    (tmp_path / "etc").mkdir()
    done = subprocess.run(
        [tool, f"--root={tmp_path}", "-"], input=SYSUSERS.read_text(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    group = (tmp_path / "etc" / "group").read_text()
    assert re.search(r"^zinfer:x:\d+:\d+:zinfer inference server:", passwd, re.M), passwd
    assert re.search(r"^zinfer-clients:x:\d+:zinfer$", group, re.M), group
