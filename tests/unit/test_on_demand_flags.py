"""``zinfer serve --model-control-mode on-demand``'s flags: ``--memory-budget`` and ``--model-idle-unload``
become ``ServerOptions``; bad values are usage errors, and the flags refuse any other mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.broker import cli
from zinfer.broker.memory_budget import MemoryBudget
from zinfer.broker.server_config import parse_config
from zinfer.client.errors import ConfigError


def test_budgets_and_idle_time_become_options(tmp_path: Path) -> None:
    args = cli.parse_args(["serve", "--model-control-mode", "on-demand", "--memory-budget", "host=512M",
                           "--memory-budget", "gpu0=2G", "--model-idle-unload", "90"])  # fmt: skip
    opts = cli.server_options(args, tmp_path)
    assert opts.model_control_mode == "on-demand"
    assert opts.memory_budget == MemoryBudget({"host": 512 << 20, "gpu0": 2 << 30})
    assert opts.model_idle_unload_s == 90.0


def test_on_demand_without_a_budget_has_no_limit(tmp_path: Path) -> None:
    opts = cli.server_options(cli.parse_args(["serve", "--model-control-mode", "on-demand"]), tmp_path)
    assert not opts.memory_budget and opts.model_idle_unload_s is None


@pytest.mark.parametrize(
    "flags", [["--memory-budget", "ram=1G"], ["--memory-budget", "host=lots"], ["--model-idle-unload", "0"],
              ["--model-control-mode", "lazy"]],
)  # fmt: skip
def test_bad_values_are_usage_errors(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["serve", "--model-control-mode", "on-demand", *flags])
    assert exc.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["none", "explicit"])
def test_the_flags_need_on_demand_mode(tmp_path: Path, mode: str) -> None:
    args = cli.parse_args(["serve", "--model-control-mode", mode, "--memory-budget", "host=1G"])
    with pytest.raises(ConfigError, match="need --model-control-mode on-demand"):
        cli.server_options(args, tmp_path)


def test_the_config_file_takes_on_demand(tmp_path: Path) -> None:
    assert parse_config({"model_control_mode": "On-Demand"}, tmp_path) == {"model_control_mode": "on-demand"}
