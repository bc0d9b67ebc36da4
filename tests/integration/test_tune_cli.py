"""``zinfer tune`` against a real server with explicit model control, on a temp copy of ``add``."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import MODELS, ServerProcess
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.tools.tune_cli import main
from zinfer.tools.tune_points import Point, apply_point, default_ranges

pytestmark = pytest.mark.integration


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    return repo


def test_apply_point_changes_only_the_swept_fields() -> None:
    text = (MODELS / "add" / "config.pbtxt").read_text()
    out = apply_point(text, Point(8, (4, 8), 100, 2))
    assert out.startswith("# OUTPUT_SUM") and 'string_value: "add"' in out
    config = parse_model_config(out, source="t", model_name="add")
    assert config.max_batch_size == 8 and [g.count for g in config.instance_group] == [2]
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.preferred_batch_size == (4, 8)
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert apply_point(text, Point()) == text


def test_tiny_sweep_writes_the_best_config_and_restores_the_original(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _repo(tmp_path)
    original = (repo / "add" / "config.pbtxt").read_text()
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    out = tmp_path / "best.pbtxt"
    code = main(["-m", "add", "--model-repository", str(repo), "--url", server.url,
                 "--latency-budget-ms", "1000", "--max-batch-size", "4,8", "--max-queue-delay-us", "0",
                 "--instance-count", "1", "--concurrency", "4", "--measurement-interval", "1",
                 "--time-limit", "60", "--output", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "mbs=4" in printed and "mbs=8" in printed and "best within" in printed
    best = parse_model_config(out.read_text(), source=str(out), model_name="add")
    ranked = _final_table(printed)
    assert len(ranked) == 2
    fits = [r for r in ranked if r["fits"]]
    chosen = [r for r in ranked if r["best"]]
    assert fits and chosen == [max(fits, key=lambda r: float(r["throughput"]))]  # the fastest that fits
    assert f"mbs={best.max_batch_size}" in str(chosen[0]["label"])  # and that is the config written
    assert (repo / "add" / "config.pbtxt").read_text() == original


def test_without_explicit_model_control_it_says_so_and_changes_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = _repo(tmp_path)
    original = (repo / "add" / "config.pbtxt").read_text()
    server = server_factory(repo)
    code = main(["-m", "add", "--model-repository", str(repo), "--url", server.url,
                 "--latency-budget-ms", "10", "--max-batch-size", "4", "--measurement-interval", "0.2",
                 "--output", str(tmp_path / "best.pbtxt")])  # fmt: skip
    assert code == 2
    assert "--model-control-mode explicit" in capsys.readouterr().err
    assert (repo / "add" / "config.pbtxt").read_text() == original
    assert not (tmp_path / "best.pbtxt").exists()


def test_default_ranges_come_from_the_config_the_budget_and_the_machine() -> None:
    text = (MODELS / "add" / "config.pbtxt").read_text()  # max_batch_size 16, delay 0, one CPU instance
    config = parse_model_config(text, source="t", model_name="add")
    ranges = default_ranges(config, budget_us=5000, cpus=8)
    assert ranges == {
        "max_batch_size": [4, 8, 16],
        "preferred_batch_size": [()],
        "max_queue_delay_us": [0, 250, 1000],
        "instance_count": [1, 2, 4],
    }
    gpu_text = apply_point(text, Point(instance_count=3)).replace("KIND_CPU", "KIND_GPU")
    gpu = parse_model_config(gpu_text, source="t", model_name="add")
    assert default_ranges(gpu, 5000, cpus=2)["instance_count"] == [1, 2, 3]
    no_batching = apply_point(text, Point(max_batch_size=0))
    no_batching = no_batching.replace("dynamic_batching { max_queue_delay_microseconds: 0 }", "")
    unbatched = parse_model_config(no_batching, source="t", model_name="add")
    assert set(default_ranges(unbatched, 5000, cpus=1)) == {"instance_count"}


def test_without_ranges_it_sweeps_the_defaults_and_prints_the_table(
    server_factory: Callable[..., ServerProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's command (no ranges) sweeps several points, prints each, and writes the best."""
    repo = _repo(tmp_path)
    server = server_factory(repo, "--model-control-mode", "explicit", "--load-model", "add")
    out = tmp_path / "best.pbtxt"
    code = main(["-m", "add", "--model-repository", str(repo), "--url", server.url,
                 "--latency-budget-ms", "1000", "--concurrency", "2", "--measurement-interval", "0.3",
                 "--max-points", "3", "--output", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "default ranges" in printed and "max_batch_size 4,8,16" in printed
    rows = [line for line in printed.splitlines() if re.match(r"\s+\d+\s+mbs=", line)]
    assert len(rows) == 2 * 3, printed  # three points, as measured and again in the final table
    assert "tried 3 point(s)" in printed and "<- best" in printed and out.is_file()


def _final_table(printed: str) -> list[dict[str, object]]:
    """The rows of the final table (after "tried N point(s)"): label, throughput, whether within the budget
    and error-free, whether marked best."""
    rows: list[dict[str, object]] = []
    for line in printed.split("highest throughput first:", 1)[1].splitlines()[2:]:
        if not line.strip():
            break
        marked = line.endswith("  <- best")
        body = line.removesuffix("  <- best")
        over = body.endswith("  over budget")
        fields = body.removesuffix("  over budget").split()
        errors = int(fields[-1])
        rows.append({"label": body[5:45].strip(), "throughput": float(fields[-5]), "best": marked,
                     "fits": not over and errors == 0})  # fmt: skip
    return rows
