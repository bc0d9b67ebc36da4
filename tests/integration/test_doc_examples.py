"""Every fenced example of README.md and docs/*.md runs as written against a real server (bundled models).

Blocks are read with pytest-codeblocks (``extract_from_file``): ``python`` blocks run in a fresh interpreter,
``bash``/``sh`` blocks in bash, and ``console`` transcripts run each ``$ `` line (their output is
illustrative). ``Client()`` finds the test server through ``ZINFER_RUNTIME_DIR``, as in the docs, and
``127.0.0.1:8002`` (the default metrics address) is the test server's own address; so are ``127.0.0.1:8000``
and ``127.0.0.1:8001`` (Triton's HTTP and gRPC ports, where the docs put the front door): its doors. An
example that cannot run here (a GPU, systemd as PID 1, root, a run without end) carries
``<!--pytest.mark.skip(reason="...")-->`` on the line before it and is skipped with that reason.

A ``python`` block that is a model's ``model.py`` (its first line ``# <repo>/<model>/1/model.py``) is run
as a model: when ``configs/models/<model>`` is bundled, its ``execute`` must return every output the
bundled config declares, with the declared dtype.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pytest_codeblocks import CodeBlock, extract_from_file

from tests.conftest import MODELS, ROOT, ServerProcess, start_server
from tests.frontdoor_helpers import free_port, wait_grpc, wait_http
from zinfer.modelconfig.model_config import parse_model_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "bash", "sh", "console")
DEFAULT_HTTP = "127.0.0.1:8002"
DOOR_HTTP, DOOR_GRPC = "127.0.0.1:8000", "127.0.0.1:8001"
DOORS: dict[str, str] = {}  # the documented door address -> the test server's (set by ``server``)
_MODEL_FILE = re.compile(r"#\s*<repo>/(\w+)/\d+/model\.py")


def _blocks() -> list[object]:
    params = []
    for doc in DOCS:
        for block in extract_from_file(doc):
            if block.syntax not in RUN:
                continue
            marks = [_mark(m, doc, block) for m in block.marks]
            name = f"{doc.relative_to(ROOT)}:{block.lineno}"
            params.append(pytest.param(block, id=name, marks=marks))
    return params


def _mark(text: str, doc: Path, block: CodeBlock) -> pytest.MarkDecorator:
    """Only ``pytest.mark.skip(reason="...")`` is allowed in the docs: every skip says why."""
    m = re.fullmatch(r"pytest\.mark\.skip\(reason=(\"[^\"]+\")\)", text.strip())
    if m is None:
        want = '<!--pytest.mark.skip(reason="why")-->'
        raise AssertionError(f"{doc.name}:{block.lineno}: write {want}, got {text}")
    return pytest.mark.skip(reason=ast.literal_eval(m.group(1)))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    s = start_server(MODELS, "--metrics", "127.0.0.1:0", "--http", http, "--grpc", grpc)
    try:
        wait_http(http)
        wait_grpc(grpc).close()
    except AssertionError as exc:
        s.stop()
        raise AssertionError(f"{exc}\n{s.log()}") from None
    DOORS.update({DOOR_HTTP: http, DOOR_GRPC: grpc})
    yield s
    assert s.stop() == 0, s.log()
    shutil.rmtree(s.runtime_dir.parent, ignore_errors=True)
    s.log_path.unlink(missing_ok=True)


def _env(server: ServerProcess) -> dict[str, str]:
    env = dict(os.environ)
    env["ZINFER_RUNTIME_DIR"] = str(server.runtime_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `zinfer` of this venv
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(argv: list[str], server: ServerProcess, tmp_path: Path, what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=tmp_path, env=_env(server),
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _model_check(code: str, model: str) -> str:
    """A script that runs the documented model.py on inputs of the bundled config and checks its outputs."""
    return f"""{code}

import numpy as np
from pathlib import Path
from zinfer.modelconfig.model_config import parse_model_config
from zinfer.client.dtypes import config_to_wire, wire_to_numpy

path = Path({str(MODELS / model / "config.pbtxt")!r})
config = parse_model_config(path.read_text(), source=str(path), model_name={model!r})
def sample(t):
    shape = (2, *[1 if d < 0 else d for d in t.dims])
    if t.data_type == "TYPE_STRING":
        a = np.empty(shape, dtype=object)
        a.reshape(-1)[:] = [b"hello world"] * a.size
        return a
    return np.ones(shape, dtype=wire_to_numpy(config_to_wire(t.data_type)))
model = Model()
if hasattr(model, "initialize"):
    model.initialize({{"name": config.name, "device": "cpu", "device_kind": "CPU", "device_id": 0}})
out = model.execute({{t.name: sample(t) for t in config.input}})
for t in config.output:
    assert t.name in out, f"{{t.name}} declared by the config but not returned"
    want = wire_to_numpy(config_to_wire(t.data_type))
    got = np.asarray(out[t.name])
    assert got.dtype == want or (want.kind == "O" and got.dtype.kind in "OSU"), (t.name, got.dtype, want)
    assert got.shape[0] == 2, (t.name, got.shape)
print("model ok")
"""


@pytest.mark.parametrize("block", _blocks())
def test_doc_example_runs(block: CodeBlock, server: ServerProcess, tmp_path: Path) -> None:
    http = server.http_url.removeprefix("http://")
    code = block.code.replace(DEFAULT_HTTP, http)
    for documented, real in DOORS.items():
        code = code.replace(documented, real)
    if block.syntax == "python":
        first = code.lstrip().splitlines()[0]
        model = _MODEL_FILE.match(first)
        if model and (MODELS / model.group(1) / "config.pbtxt").is_file():
            code = _model_check(code, model.group(1))
        # triton_python_backend_utils is importable inside a worker; here, as the worker makes it
        prelude = (
            "import sys, zinfer.workers.triton_python_backend_utils as pb\n"
            "sys.modules.setdefault('triton_python_backend_utils', pb)\n"
        )
        _run([sys.executable, "-c", prelude + code], server, tmp_path, f"python block at line {block.lineno}")
    elif block.syntax == "console":
        commands = [line[2:] for line in code.splitlines() if line.startswith("$ ")]
        assert commands, f"console block at line {block.lineno} has no '$ ' line"
        for command in commands:
            _run(["bash", "-euo", "pipefail", "-c", command], server, tmp_path, f"$ {command}")
    else:
        tool = code.split()[0]
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed on this machine")
        _run(["bash", "-euo", "pipefail", "-c", code], server, tmp_path, f"bash block at line {block.lineno}")


def test_every_example_is_run_or_skipped_with_a_reason() -> None:
    """Python and shell blocks of other syntaxes ('py', 'shell', none) would be silently left out."""
    for doc in DOCS:
        for block in extract_from_file(doc):
            where = f"{doc.name}:{block.lineno}"
            shown = ("ini", "yaml", "promql", "text", "json", "")  # data and output, nothing to run
            assert block.syntax in (*RUN, *shown), f"{where}: {block.syntax}"
            if block.syntax == "":
                assert not block.code.lstrip().startswith(("$ ", "import ", "from ", "sudo ")), (
                    f"{where}: an unlabelled block that looks like code: label it"
                )


def test_every_metric_named_in_observability_md_is_exported(tmp_path: Path) -> None:
    """Per-model series need a request; the cache series a model with the response cache and --cache-bytes;
    the GPU series NVML (absent on a machine without an NVIDIA driver, as the doc says)."""
    import urllib.request

    from zinfer.client import Client

    text = (ROOT / "docs" / "observability.md").read_text()
    named = set(re.findall(r"`((?:nv|zinfer)_[a-z0-9_]+)`", text))
    for block in extract_from_file(ROOT / "docs" / "observability.md"):
        if block.syntax == "promql":
            named |= set(re.findall(r"\b((?:nv|zinfer)_[a-z0-9_]+)\b", block.code))
    repo = tmp_path / "models"
    shutil.copytree(MODELS / "add", repo / "add")
    config = repo / "add" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    parse_model_config(config.read_text(), source=str(config), model_name="add")
    server = start_server(repo, "--cache-bytes", "1048576")
    try:
        one = np.ones((1, 1), np.float32)
        with Client(server.url, timeout=30) as client:
            for _ in range(2):  # a miss, then a hit
                client.infer("add", {"INPUT_A": one, "INPUT_B": one})
        with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
            exported = reply.read().decode()
    finally:
        assert server.stop() == 0, server.log()
        shutil.rmtree(server.runtime_dir.parent, ignore_errors=True)
        server.log_path.unlink(missing_ok=True)
    series = {line.split("{")[0].split(" ")[0] for line in exported.splitlines() if line and line[0] != "#"}
    suffixes = ("", "_total", "_bucket", "_sum", "_count")
    missing = sorted(n for n in named if not any(n + s in series for s in suffixes))
    if not _nvml():
        missing = [n for n in missing if not n.startswith(("nv_gpu_", "nv_energy_"))]
    assert not missing, f"named in docs/observability.md but not on /metrics: {missing}"


def _nvml() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
