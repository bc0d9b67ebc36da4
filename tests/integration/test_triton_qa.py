"""Triton's own python-backend qa tests, run unchanged with the real tritonclient against ``zinfer serve``.

Nothing of Triton's is kept in this repository: each suite's model repository is assembled at test time, as
its ``test.sh`` does, from a local git copy of Triton's server repository named by ``TRITON_SERVER_GIT``
(its ``.git`` folder, or a bare mirror), and the suite's test file (with ``qa/common``) is read from the same
copy and run by pytest in a child process. Without that variable, or without tritonclient, every test here
is skipped (CI has no network: ``tests/integration/test_triton_qa_behaviour.py`` covers the same behaviour
with zinfer's own models).

The qa tests talk to ``localhost:8000`` (HTTP), ``localhost:8001`` (gRPC) and ``localhost:8002`` (metrics) as
in Triton's CI, so the server listens there; a suite is skipped when one of those ports is taken. Each test
asserts that every qa test case of its suite passes except those its ``not_run`` lists (they need torch or
python_backend's examples). Run::

    TRITON_SERVER_GIT=/path/to/server/.git .venv/bin/python -m pytest tests/integration/test_triton_qa.py -v
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, start_server, stop_all

pytestmark = pytest.mark.integration
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

GIT_DIR = os.environ.get("TRITON_SERVER_GIT", "")
QA = "qa/L0_backend_python"
MODELS = "qa/python_models"


@dataclass(frozen=True)
class Model:
    """One model of a suite's repository: ``source`` a folder of Triton's repository with ``model.py`` and
    ``config.pbtxt`` (or ``model_file`` and ``config_file`` named apart), edited as the suite's test.sh does:
    ``rename`` sets the config's name, ``replace`` substitutes text, ``append`` adds lines."""

    name: str
    source: str = ""
    model_file: str = ""
    config_file: str = ""
    extra: tuple[str, ...] = ()  # more files copied next to model.py
    rename: bool = False
    replace: tuple[tuple[str, str], ...] = ()  # (regular expression, replacement), line by line
    append: str = ""


@dataclass(frozen=True)
class Suite:
    tests: tuple[str, ...]  # test files under qa/L0_backend_python, then optional "::Class" selectors
    models: tuple[Model, ...]
    server_args: tuple[str, ...] = ()
    not_run: tuple[str, ...] = field(default_factory=tuple)  # "Class::test" deselected (the reason beside)
    log_name: str = ""  # the server log's name in the test's folder, where a test reads it (test.sh's)
    env: tuple[tuple[str, str], ...] = ()  # for the test process


def _m(name: str, src: str = "", **kw: object) -> Model:
    return Model(name, src or f"{MODELS}/{name}", **kw)  # type: ignore[arg-type]


DECOUPLED_LOCAL = (
    "decoupled_bls", "decoupled_bls_async_cancel", "decoupled_bls_cancel",
    "decoupled_bls_cancel_after_complete", "decoupled_bls_stream", "decoupled_execute_error",
    "decoupled_raise_exception",
    "decoupled_return_response_error", "decoupled_send_after_close_error",
)  # fmt: skip

RESPONSE_SENDER = tuple(
    Model(
        name,
        f"{MODELS}/response_sender",
        model_file="model_async.py" if "async" in name else "model.py",
        extra=("model_common.py",),
        append=("model_transaction_policy { decoupled: True }\n" if "decoupled" in name else "")
        + ("dynamic_batching { max_queue_delay_microseconds: 500000 }\n" if "batching" in name else ""),
    )
    for name in (
        "response_sender", "response_sender_decoupled", "response_sender_async",
        "response_sender_decoupled_async",
        "response_sender_batching", "response_sender_decoupled_batching", "response_sender_async_batching",
        "response_sender_decoupled_async_batching",
    )
)  # fmt: skip


BATCHING = "dynamic_batching {{ preferred_batch_size: [8], max_queue_delay_microseconds: {} }}\n"


def _identity(name: str, data_type: str) -> Model:
    """test.sh's copy of identity_fp32 with another data type."""
    return _m(name, f"{MODELS}/identity_fp32", rename=True, replace=(("TYPE_FP32", data_type),))


def _readiness(name: str, value: str, delay: str) -> Model:
    source = "readiness_coroutine_model.py" if value == "coroutine" else "readiness_model.py"
    return Model(
        name,
        f"{MODELS}/identity_fp32",
        model_file=f"{QA}/model_readiness/test_models/{source}",
        rename=True,
        append=(
            f'parameters: {{ key: "READINESS_FN_RETURN_VALUE" value: {{ string_value: "{value}" }} }}\n'
            f'parameters: {{ key: "READINESS_FN_DELAY_SECS" value: {{ string_value: "{delay}" }} }}\n'
        ),
    )


SUITES: dict[str, Suite] = {
    "parameters": Suite(
        ("parameters/response_parameters_test.py",),
        (_m("response_parameters"), _m("response_parameters_decoupled"), _m("response_parameters_bls")),
    ),
    "async_execute": Suite(
        ("async_execute/concurrency_test.py",),
        (_m("async_execute_decouple"), _m("async_execute_decouple_bls")),
    ),
    "response_sender": Suite(("response_sender/response_sender_test.py",), RESPONSE_SENDER),
    "response_sender_complete_final": Suite(
        ("response_sender/response_sender_complete_final_test.py",), (_m("response_sender_complete_final"),)
    ),
    "decoupled": Suite(
        ("decoupled/decoupled_test.py",),
        (
            _m("identity_fp32"),
            _m("execute_cancel", append="model_transaction_policy { decoupled: True }\n"),
            _m("response_sender_until_cancelled"),
            *(
                Model(n, f"{QA}/decoupled/models/{n}", model_file=f"{QA}/decoupled/models/{n}/1/model.py")
                for n in DECOUPLED_LOCAL
            ),
        ),  # fmt: skip
        # square_int32 comes from python_backend's examples; decoupled_bls imports torch
        not_run=("DecoupledTest::test_decoupled_bls_stream", "DecoupledTest::test_decoupled_bls"),
        log_name="decoupled_server.log",
    ),
    "lifecycle": Suite(
        ("lifecycle/lifecycle_test.py",),
        (
            _m("error_code"),
            _m("execute_cancel"),
            _m(
                "execute_error",
                rename=True,
                replace=(("max_batch_size: 0", "max_batch_size: 8"),),
                append=BATCHING.format(12000000),
            ),
            _m(
                "execute_grpc_error",
                rename=True,
                replace=(("max_batch_size: 0", "max_batch_size: 8"),),
                append=BATCHING.format(1200000),
            ),
            _m("decoupled_grpc_error"),
            _m("execute_return_error"),
            _m("wrong_model", rename=True, replace=(("TYPE_FP32", "TYPE_UINT32"),)),
        ),  # fmt: skip
        log_name="lifecycle_server.log",
    ),
    "model_readiness": Suite(
        ("model_readiness/test_model_readiness.py::TestUserDefinedModelReadinessFunction",),
        (
            _m("identity_fp32"),
            _readiness("is_ready_fn_returns_true", "true", "0.1"),
            _readiness("is_ready_fn_returns_false", "false", "0.1"),
            _readiness("is_ready_fn_raises_error", "exception", "0.1"),
            _readiness("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
            _readiness("is_ready_fn_timeout", "true", "8"),
            _readiness("is_ready_fn_coroutine_returns_true", "coroutine", "0.1"),
            Model(
                "is_ready_fn_returns_true_decoupled",
                f"{QA}/model_readiness/test_models/is_ready_fn_returns_true_decoupled",
            ),
        ),  # fmt: skip
    ),
    "bls_parameters": Suite(("bls/bls_parameters_test.py",), (_m("bls_parameters"),)),
    "ensemble": Suite(
        ("ensemble/ensemble_test.py",),
        (_m("ensemble"), _m("add_sub_1", f"{MODELS}/add_sub"), _m("add_sub_2", f"{MODELS}/add_sub")),
        not_run=("EnsembleTest::test_ensemble_gpu",),  # a GPU and libtorch models
    ),
    "model_control": Suite(
        ("model_control/model_control_test.py",),
        (
            _m("identity_fp32"),
            Model(
                "simple_identity_fp32",
                f"{MODELS}/identity_fp32",
                config_file=f"{MODELS}/simple_identity_fp32/config.pbtxt",
            ),
        ),  # fmt: skip
        server_args=("--model-control-mode", "explicit"),
    ),
    "logging": Suite(("logging/logging_test.py",), (_m("identity_fp32_logging"),)),
    "argument_validation": Suite(
        ("test_infer_shm_leak.py",),
        (
            Model(
                "argument_validation",
                f"{QA}/argument_validation/models/argument_validation",
                model_file=f"{QA}/argument_validation/models/argument_validation/1/model.py",
            ),
        ),  # fmt: skip
        env=(("MODEL_NAME", "argument_validation"),),
    ),
    # custom_metrics is not assembled: its model reads /metrics within execute, right after setting a value,
    # and zinfer's workers report custom metrics with their next heartbeat (a gap, docs/models.md)
    "io": Suite(
        (
            "io/io_test.py::IOTest::test_requested_output_default",
            "io/io_test.py::IOTest::test_requested_output_decoupled_prior_crash",
        ),
        (_m("add_sub"), Model("llm", f"{QA}/io/requested_output_model")),
        # test_ensemble_io, test_empty_gpu_output, test_variable_gpu_output and
        # test_requested_output_decoupled need torch (DLPack models) and a GPU; test.sh runs them apart
    ),  # fmt: skip
    # restart is not assembled: its model imports c_python_backend_utils (Triton's shm pool internals), and
    # test.sh kills the stub processes between its two tests
    # request_rescheduling is not assembled: its models need sequence_batching.iterative_sequence and
    # request rescheduling (set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)), not yet supported
    "python_test": Suite(
        ("python_test.py",),
        (
            _m("identity_fp32"),
            _m(
                "identity_uint8",
                f"{MODELS}/identity_fp32",
                rename=True,
                replace=(
                    ("TYPE_FP32", "TYPE_UINT8"),
                    ("^max_batch_size:.*", "max_batch_size: 8"),
                ),
                append=BATCHING.format(12000000),
            ),
            _m(
                "identity_uint8_nobatch",
                f"{MODELS}/identity_fp32",
                rename=True,
                replace=(("TYPE_FP32", "TYPE_UINT8"), ("^max_batch_size:.*", "")),
            ),
            _identity("identity_uint32", "TYPE_UINT32"),
            _identity("identity_bool", "TYPE_BOOL"),
            _m("delayed_model"),
            _m("init_args", replace=(("TRITON_DIR_PATH", "/opt/tritonserver"),)),
            _m("optional"),
            _m("non_contiguous"),
            _m("string"),
            _m("string_fixed"),
        ),  # fmt: skip
        # Triton's shm pool growth, and torch (identity_bf16 and pytorch_fp32_fp32 import it)
        not_run=("PythonTest::test_growth_error", "PythonTest::test_infer_pytorch", "PythonTest::test_bf16"),
        env=(("TEST_JETSON", "1"),),  # leaves out the GPU and DLPack-on-GPU tests, as on a Jetson
    ),
}


SHM_MONITOR_STANDIN = """
class SharedMemoryManager:
    def __init__(self, name, create=False):
        self.name = name

    def free_memory(self):
        return 0
"""


def _git(*args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", GIT_DIR, *args], check=True, capture_output=True, timeout=60
    ).stdout


def _show(path: str) -> bytes:
    return _git("show", f"HEAD:{path}")


def _tree(path: str) -> list[str]:
    return [p for p in _git("ls-tree", "-r", "--name-only", "HEAD", path).decode().splitlines() if p]


def _write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def assemble(model: Model, repo: Path) -> None:
    """The model's folder under ``repo``, as the suite's test.sh builds it."""
    folder = repo / model.name
    model_file = (
        model.model_file if "/" in model.model_file else f"{model.source}/{model.model_file or 'model.py'}"
    )
    if model.model_file or f"{model.source}/model.py" in _tree(model.source):
        _write(folder / "1" / "model.py", _show(model_file))
    else:  # an ensemble: its config alone
        (folder / "1").mkdir(parents=True)
    for name in model.extra:
        _write(folder / "1" / name, _show(f"{model.source}/{name}"))
    config = _show(model.config_file or f"{model.source}/config.pbtxt").decode()
    if model.rename:
        config = re.sub(r"(?m)^name:.*$", f'name: "{model.name}"', config)
    for pattern, new in model.replace:  # test.sh's sed -i "s/pattern/new/g"
        config = re.sub(pattern, new, config, flags=re.MULTILINE)
    (folder / "config.pbtxt").write_text(config + ("\n" + model.append if model.append else ""))


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no owner
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def mirror() -> str:
    if not GIT_DIR:
        pytest.skip("TRITON_SERVER_GIT is not set (a local git copy of triton-inference-server/server)")
    try:
        _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"TRITON_SERVER_GIT={GIT_DIR} is not a git repository")
    return GIT_DIR


@pytest.fixture
def qa_server(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    servers: list[ServerProcess] = []
    yield servers
    stop_all(servers)


def _run_suite(name: str, tmp_path: Path, servers: list[ServerProcess]) -> tuple[int, int, str]:
    """Assemble, serve, run; (passed, ran, report)."""
    suite = SUITES[name]
    if not all(_port_free(p) for p in (8000, 8001, 8002)):
        pytest.skip("ports 8000, 8001 and 8002, which Triton's qa tests use, are taken")
    qa = tmp_path / "qa"
    for path in _tree("qa/common"):
        if path.endswith(".py"):
            _write(tmp_path / path, _show(path))
    # qa/common/shm_util imports Triton's compiled shm pool monitor; zinfer has no such pool (its segments
    # are its own), so the stand-in watches nothing and every leak probe passes through
    (tmp_path / "qa" / "common" / "triton_shm_monitor.py").write_text(SHM_MONITOR_STANDIN)
    # where Triton's CI keeps it: a model that checks its model_repository argument (init_args) finds it
    # under $TRITON_DIR/qa/L0_backend_python/models
    repo = qa / "L0_backend_python" / "models"
    repo.mkdir(parents=True)
    for model in suite.models:
        assemble(model, repo)
    files = [t.split("::")[0] for t in suite.tests]
    for f in files:
        _write(qa / "L0_backend_python" / f, _show(f"{QA}/{f}"))
    doors = ("--grpc", "127.0.0.1:8001", "--http", "127.0.0.1:8000", "--metrics", "127.0.0.1:8002")
    servers.append(start_server(repo, *doors, *suite.server_args, ready_timeout=120))
    cwd = qa / "L0_backend_python" / Path(files[0]).parent
    if suite.log_name:
        (cwd / suite.log_name).symlink_to(servers[0].log_path)
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(qa / "common"), "SERVER_LOG": str(servers[0].log_path),
           **dict(suite.env)}  # fmt: skip
    selectors = [t.split("/")[-1] for t in suite.tests]
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    collect = [*pytest_cmd, "--collect-only", "-q", *selectors]
    collected = subprocess.run(collect, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    ids = collected.stdout.splitlines()
    skipped = {f"{Path(files[0]).name}::{n}" for n in suite.not_run}  # exact ids (--deselect takes prefixes)
    ids = [line for line in ids if "::" in line and line not in skipped]
    proc = subprocess.run([*pytest_cmd, "-q", f"--junitxml={report}", *ids], cwd=cwd, capture_output=True,
                          text=True, timeout=900, env=env)  # fmt: skip
    root = ET.parse(report).getroot()
    cases = root.iter("testcase")
    ran = passed = 0
    for case in cases:
        if case.find("skipped") is not None:
            continue
        ran += 1
        passed += case.find("failure") is None and case.find("error") is None
    return passed, ran, proc.stdout[-6000:] + "\n--- server log ---\n" + servers[0].log()[-6000:]


@pytest.mark.parametrize("name", sorted(SUITES))
def test_triton_qa_suite(
    name: str, mirror: str, tmp_path: Path, qa_server: list[ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_DIR", str(tmp_path))  # for the server, and so its workers
    passed, ran, report = _run_suite(name, tmp_path, qa_server)
    pytest_output = report.split("\n--- server log ---")[0].splitlines()
    summary = next((line for line in reversed(pytest_output) if " in " in line), "")
    print(f"qa suite {name}: {passed} of {ran} passed ({summary.strip('= ')})")
    assert ran and passed == ran, report
