"""The pure halves of the first-hour fixes: Triton platforms zinfer does not run are named before any GPU
placement; enums print as Triton writes them; a misspelled serve flag gets serve's usage; ``zinfer tune``
says what bounded a sweep that found nothing; the HTTP door's not-ready reason."""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest

from zinfer.broker.cli_parser import parser
from zinfer.broker.registry import ModelRegistry
from zinfer.frontdoor.bridge_records import RepositoryModel
from zinfer.frontdoor.http_views import not_ready_reason
from zinfer.modelconfig.backends import unsupported_backend
from zinfer.modelconfig.instances import InstanceKind
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.modelconfig.repository import load_model_entry
from zinfer.tools.perf_report import StepResult
from zinfer.tools.status_view import main as status_main
from zinfer.tools.tune_cli import Outcome, nothing_fits
from zinfer.tools.tune_points import Point

SIGNATURE = (
    'max_batch_size: 8\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)


def _config(head: str) -> str:
    return f'name: "m"\n{head}\n{SIGNATURE}'


@pytest.mark.parametrize(
    ("head", "named"),
    [
        ('platform: "tensorrt_plan"', "platform 'tensorrt_plan'"),
        ('platform: "pytorch_libtorch"', "platform 'pytorch_libtorch'"),
        ('platform: "tensorflow_savedmodel"', "platform 'tensorflow_savedmodel'"),
        ('platform: "tensorflow_graphdef"', "platform 'tensorflow_graphdef'"),
        ('backend: "openvino"', "backend 'openvino'"),
        ('backend: "tensorrtllm"', "backend 'tensorrtllm'"),
        ('backend: "mine"', "backend 'mine'"),
    ],
)
def test_unsupported_backends_are_named_with_what_runs(head: str, named: str) -> None:
    config = parse_model_config(_config(head), source="t", model_name="m")
    problem = unsupported_backend(config)
    assert problem is not None and named in problem and "is not supported by zinfer" in problem
    assert "docs/from-triton.md" in problem


@pytest.mark.parametrize(
    "head",
    ['backend: "python"', 'backend: "zinfer"', 'backend: "onnxruntime"', 'platform: "onnxruntime_onnx"'],
)
def test_supported_backends_pass(head: str) -> None:
    assert unsupported_backend(parse_model_config(_config(head), source="t", model_name="m")) is None


def test_a_tensorrt_model_on_kind_gpu_is_refused_for_its_platform_not_for_the_gpu(tmp_path: Path) -> None:
    """The check runs before placement: a box without CuPy hears about the platform, never about CuPy."""
    model = tmp_path / "trt"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.plan").write_bytes(b"\0")
    (model / "config.pbtxt").write_text(
        _config('platform: "tensorrt_plan"').replace('"m"', '"trt"')
        + "instance_group [ { kind: KIND_GPU count: 1 } ]\n"
    )
    entry = load_model_entry(model)
    assert entry.error is not None and "tensorrt_plan" in entry.error
    prepared, error = ModelRegistry().prepare(entry)  # before this check: "KIND_GPU but no usable GPU"
    assert prepared == [] and error is not None
    assert "tensorrt_plan" in error and "CuPy" not in error and "GPU" not in error


def test_a_folder_without_config_but_with_a_triton_model_file_says_which_backend(tmp_path: Path) -> None:
    for filename, platform in (("model.plan", "tensorrt_plan"), ("model.pt", "pytorch_libtorch")):
        model = tmp_path / platform
        (model / "1").mkdir(parents=True)
        (model / "1" / filename).write_bytes(b"\0")
        entry = load_model_entry(model)
        assert entry.error is not None and platform in entry.error and "is not supported" in entry.error


def test_enums_print_as_triton_writes_them() -> None:
    kind = InstanceKind.KIND_GPU
    assert (str(kind), f"{kind}", f"{kind:>9}") == ("KIND_GPU", "KIND_GPU", " KIND_GPU")
    assert "%s" % kind == "KIND_GPU"  # noqa: UP031 - the logging module formats this way
    assert kind == "KIND_GPU" and InstanceKind("KIND_GPU") is kind


def test_a_misspelled_serve_flag_is_serves_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parser().parse_args(["serve", "--metrics-port", "9000"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: zinfer serve ")
    assert "zinfer serve: error: unrecognized arguments: --metrics-port 9000" in err
    args = parser().parse_args(["serve", "--no-metrics"])  # known flags still parse
    assert isinstance(args, argparse.Namespace) and args.metrics == "off"


def test_serve_help_states_the_metrics_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--help"])
    assert "default: 127.0.0.1:8002" in " ".join(capsys.readouterr().out.split())


def _result(p99_us: float, throughput: float, errors: int = 0, compute_us: float = 100.0) -> StepResult:
    return StepResult(
        mode="concurrency", concurrency=8, request_rate=None, requests=100, errors=errors, duration_s=1.0,
        throughput_infer_s=throughput, avg_us=p99_us / 2, p50_us=p99_us / 2, p90_us=p99_us, p95_us=p99_us,
        p99_us=p99_us, server_requests=100, server_queue_us=0.0, server_compute_input_us=0.0,
        server_compute_infer_us=compute_us, server_compute_output_us=0.0, mean_batch=1.0,
    )  # fmt: skip


def test_tune_says_the_budget_bounded_it_and_what_to_try() -> None:
    outcomes = [
        Outcome(Point(4), "", _result(9000.0, 2000.0)),
        Outcome(Point(8), "", _result(7000.0, 2500.0)),
    ]
    lines = nothing_fits(outcomes, budget_us=1000.0, concurrency=64, batch_size=1, planned=2, load=(9.0, 2))
    text = "\n".join(lines)
    assert "bounded by the latency budget: the lowest p99 was 7.00 ms (mbs=8" in text, text
    # 2500 requests/s within half of 1 ms: 1 in flight, not 64
    assert "try --concurrency 1" in text and "Little's law" in text
    assert "machine is busy (load average 9.0 on 2 CPUs)" in text
    assert "raise --latency-budget-ms to at least 8.4" in text
    assert "time limit" not in text


def test_tune_names_the_time_limit_errors_and_slow_batches() -> None:
    assert (
        "time limit stopped the sweep after 1 of 3 points"
        in nothing_fits([Outcome(Point(4), "", _result(9000.0, 10.0))], 1000.0, 1, 1, planned=3)[0]
    )
    erring = nothing_fits([Outcome(Point(4), "", _result(900.0, 10.0, errors=3))], 1000.0, 1, 1, 1)
    assert erring == ["every point had errors: 'zinfer perf -m MODEL' shows them"]
    skipped = nothing_fits([Outcome(Point(4), "", None, "invalid")], 1000.0, 1, 1, 1)
    assert "no point could be measured" in skipped[0]
    slow = "\n".join(nothing_fits([Outcome(Point(4), "", _result(9000.0, 100.0, compute_us=8000.0))],
                                  1000.0, 1, 1, 1))  # fmt: skip
    assert "one batch computes for 8.00 ms" in slow and "--concurrency" not in slow


def test_the_not_ready_reason_names_what_loads_and_what_failed() -> None:
    rows = [
        RepositoryModel("add", "1", "READY", ""),
        RepositoryModel("slow", "", "LOADING", ""),
        RepositoryModel("bad", "", "UNAVAILABLE", "boom"),
        RepositoryModel("idle", "", "UNAVAILABLE", "unloaded"),
    ]
    assert not_ready_reason(rows) == "Server is not ready: loading: slow; failed to load: bad (boom)"
    assert not_ready_reason(rows[:1]) == "Server is not ready: starting, or draining to stop"
    assert "does not answer" in not_ready_reason(None)


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


class _Source:
    def server_status(self) -> dict[str, object]:
        return {"models": [], "workers": []}

    def close(self) -> None:
        pass


def test_status_into_a_closed_pipe_ends_quietly() -> None:
    code = status_main(["--watch", "1"], connect=lambda url, timeout: _Source(), out=_ClosedPipe(),
                       sleep=lambda s: None)  # fmt: skip
    assert code == 0


ROOT = Path(__file__).resolve().parents[2]


def _first_screen() -> str:
    return (ROOT / "README.md").read_text().split("\n## ", 1)[0]


def test_readme_first_screen_says_which_build_runs_and_keeps_two_commands() -> None:
    top = _first_screen()
    assert top.count("```bash") == 2  # one installs and serves, one installs and tests (see test_docs)
    assert "pure-Python build" in top and "editable" in top
    assert "compiled" in top and "pip install ." in top and "build=compiled" in top
    assert "docs/from-triton.md" in top and "[frontdoor]" in top


def test_readme_does_not_call_working_features_unsupported() -> None:
    from zinfer.modelconfig.features import SUPPORTED_FEATURES

    text = " ".join((ROOT / "README.md").read_text().split())
    (missing,) = re.findall(r"does not have yet \(([^)]*)\)", text)
    assert {"model_warmup", "input.optional"} <= SUPPORTED_FEATURES
    assert "warmup" not in missing and "optional" not in missing, missing


def test_the_docs_point_at_what_exists() -> None:
    """systemd/README's install pointer names a file and a section that exist; deployment.md's "first log
    line" is the ``event=starting`` line (tests/integration/test_first_hour.py checks it is the first)."""
    systemd = (ROOT / "systemd" / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", systemd):
        assert (ROOT / "systemd" / target).resolve().is_file(), target
    (section,) = re.findall(r'its\s+section "([^"]+)"', systemd)
    assert f"## {section}" in (ROOT / "docs" / "deployment.md").read_text()
    assert "README's install section" not in systemd
    deployment = " ".join((ROOT / "docs" / "deployment.md").read_text().split())
    assert "first log line says what runs compiled (`event=starting" in deployment
    assert (ROOT / "docs" / "from-triton.md").is_file()


def test_the_startup_log_reports_progress_on_time_and_each_failure_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from zinfer.broker.startup_log import PROGRESS_S, StartupLog, build_name

    class _State:  # what ``progress`` reads of a loading model state
        def __init__(self, name: str, up: int, expected: int) -> None:
            self.name, self.instances, self.expected_instances = name, set(range(up)), expected

    startup = StartupLog(100.0)
    startup.where = {"socket": "ipc:///r/zinfer.sock", "tcp": "off", "grpc": "off", "metrics": "off"}
    loading = [_State("slow", 1, 2), _State("slow", 0, 2), _State("big", 0, 4)]
    with caplog.at_level("INFO", logger="zinfer.broker.server"):
        startup.progress(100.0 + PROGRESS_S - 0.1, loading, 3)  # type: ignore[arg-type]
        assert not caplog.records  # not yet
        startup.progress(100.0 + PROGRESS_S, loading, 3)  # type: ignore[arg-type]
        startup.progress(100.0 + PROGRESS_S + 1, loading, 3)  # type: ignore[arg-type]
        startup.ready(107.0, ["add:1", "slow:1"], ["bad", "trt", "bad"])
    progress, ready = (r.getMessage() for r in caplog.records)
    assert progress == ("event=loading elapsed_s=5 models_ready=3 models_loading=2 instances_up=1/8 "
                        "waiting=big,slow")  # fmt: skip
    assert ready == ("event=ready models=add:1,slow:1 failed=bad,trt socket=ipc:///r/zinfer.sock tcp=off "
                     f"grpc=off metrics=off build={build_name()} startup_s=7.0")  # fmt: skip
