"""tritonclient's own example scripts (triton-inference-server/client ``src/python/examples``), run unchanged
with the real tritonclient against ``zinfer serve``.

Nothing of Triton's is kept here. The scripts are read at test time from a git copy of
triton-inference-server/client named by ``TRITON_CLIENT_GIT``, and the models they use from Triton's
``docs/examples/model_repository`` (ONNX models and one python model) in a git copy of
triton-inference-server/server named by ``TRITON_SERVER_GIT`` (each a ``.git`` folder or a bare mirror).
Triton's qa setup builds three more models from C++ backends; ``tests/triton_sample_models`` holds
python-backend models of the same names and behaviour (its README says which). The repository is
assembled as Triton's ``qa/L0_http/test.sh`` does, and the scripts run as that test runs them (``-v``; the
sequence clients also with ``-d``, and the model-control clients against an explicit-mode server). The main
server listens on Triton's ports 8000, 8001 and 8002, which the scripts use by default (and
memory_growth_test.py always); the tests are skipped when those ports are taken, or without the two
variables or tritonclient.

``densenet_onnx`` is Triton's config and labels with the stand-in graph of ``tests/onnx_models`` in place of
the downloaded model (so the image clients' top class is checked against NumPy, not against "VULTURE"), and
the image is a generated one. The health-metadata scripts check that the server's name is "triton"; they
are run unchanged (they must stop at that check alone) and with that one comparison made against "zinfer"
(docs/models.md, "Where zinfer differs").

Not run: the cudashm clients (a GPU), ensemble_image_client (an ensemble of an image-preprocessing backend
and inception_graphdef, a TensorFlow download). image_client.py over HTTP imports ``attrdict``, which no
longer imports on Python 3.10 and later; it is skipped without it. Run::

    TRITON_CLIENT_GIT=/path/to/client/.git TRITON_SERVER_GIT=/path/to/server/.git .venv/bin/python -m \\
        pytest tests/integration/test_triton_client_examples.py -v
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerProcess, start_server, stop_all

pytestmark = pytest.mark.integration
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

CLIENT_GIT = os.environ.get("TRITON_CLIENT_GIT", "")
SERVER_GIT = os.environ.get("TRITON_SERVER_GIT", "")
OWN_MODELS = Path(__file__).resolve().parent.parent / "triton_sample_models"
DOCS_MODELS = ("simple", "simple_string", "simple_identity", "simple_sequence", "simple_dyna_sequence",
               "simple_int8")  # fmt: skip
IMAGE_COLOUR = (200, 40, 90)  # the test image: one colour, so the stand-in densenet's scores are known

IMAGE_ARGS = ("-m", "densenet_onnx", "-s", "INCEPTION", "-c", "1", "-b", "1", "../image.png")
IMAGE_CASES = [
    ("image_client.py", IMAGE_ARGS), ("image_client.py", ("-a", *IMAGE_ARGS)),
    ("image_client.py", ("-i", "grpc", "-u", "localhost:8001", *IMAGE_ARGS)),
    ("grpc_image_client.py", IMAGE_ARGS), ("grpc_image_client.py", ("-a", *IMAGE_ARGS)),
]  # fmt: skip
# script -> the argument lists it is run with, as Triton's qa runs it
SCRIPTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "grpc_client.py": ((),),  # densenet_onnx's metadata, config and one request of "a" bytes
    "grpc_explicit_byte_content_client.py": ((),),
    "grpc_explicit_int8_content_client.py": ((),),
    "grpc_explicit_int_content_client.py": ((),),
    "memory_growth_test.py": (("-r", "20"), ("-i", "grpc", "-r", "20")),
    "reuse_infer_objects_client.py": (("-v",), ("-v", "-i", "grpc", "-u", "localhost:8001")),
    "simple_grpc_aio_infer_client.py": (("-v",),),
    "simple_grpc_aio_sequence_stream_infer_client.py": (("-v",), ("-v", "-d")),
    "simple_grpc_async_infer_client.py": (("-v",),),
    "simple_grpc_custom_args_client.py": (("-v",),),
    "simple_grpc_custom_repeat.py": (("-v",),),
    "simple_grpc_infer_client.py": (("-v",),),
    "simple_grpc_keepalive_client.py": (("-v",),),
    "simple_grpc_sequence_stream_infer_client.py": (("-v",), ("-v", "-d")),
    "simple_grpc_sequence_sync_infer_client.py": (("-v",), ("-v", "-d")),
    "simple_grpc_shm_client.py": (("-v",),),
    "simple_grpc_shm_string_client.py": (("-v",),),
    "simple_grpc_string_infer_client.py": (("-v",),),
    "simple_http_aio_infer_client.py": (("-v",),),
    "simple_http_async_infer_client.py": (("-v",),),
    "simple_http_infer_client.py": (("-v",),),
    "simple_http_sequence_sync_infer_client.py": (("-v",), ("-v", "-d")),
    "simple_http_shm_client.py": (("-v",),),
    "simple_http_shm_string_client.py": (("-v",),),
    "simple_http_string_infer_client.py": (("-v",),),
}
CONTROL_SCRIPTS = ("simple_grpc_model_control.py", "simple_http_model_control.py")
# these check that the server's metadata name is "triton"; zinfer's is "zinfer", a documented difference
# (docs/models.md, "Where zinfer differs")
NAME_SCRIPTS = ("simple_grpc_health_metadata.py", "simple_http_health_metadata.py")
CASES = [(script, args) for script, runs in SCRIPTS.items() for args in runs]


def _show(git_dir: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, timeout=60).stdout  # fmt: skip


def _tree(git_dir: str, path: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", "HEAD", path],
                         check=True, capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    return out.split()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _string_dyna_config(dyna: str) -> str:
    """simple_dyna_sequence's config made into simple_string_dyna_sequence's, as qa/L0_http/test.sh does."""
    text = dyna.replace("simple_dyna_sequence", "simple_string_dyna_sequence")
    text = re.sub(r"(?m)^platform: .*$", 'backend: "python"', text)
    return re.sub(r"(CONTROL_SEQUENCE_CORRID\s*\n\s*)data_type:.*", r"\1data_type: TYPE_STRING", text)


def _densenet(folder: Path, image: Path) -> None:
    """densenet_onnx as in Triton's docs (its config and labels) with the stand-in graph of
    ``tests/onnx_models`` in place of the downloaded model.onnx, and a test image."""
    from PIL import Image

    from tests.onnx_models import densenet_standin

    prefix = "docs/examples/model_repository/densenet_onnx/"
    for name in ("config.pbtxt", "densenet_labels.txt"):
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(_show(SERVER_GIT, prefix + name))
    densenet_standin(folder / "1" / "model.onnx", batch=1)
    Image.new("RGB", (300, 200), IMAGE_COLOUR).save(image)


def _assemble(root: Path) -> tuple[Path, Path, Path, Path]:
    """(repository of Triton's qa models, the same plus the other examples' models, the scripts folder, the
    qa models and one more)."""
    qa, full, scripts = root / "qa_models", root / "models", root / "scripts"
    qa8 = root / "qa_models_8"
    for name in DOCS_MODELS:
        prefix = f"docs/examples/model_repository/{name}/"
        for path in _tree(SERVER_GIT, prefix):
            dest = qa / path.removeprefix(prefix.rsplit("/", 2)[0] + "/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(_show(SERVER_GIT, path))
    shutil.copytree(OWN_MODELS / "simple_string_dyna_sequence", qa / "simple_string_dyna_sequence")
    config = (qa / "simple_dyna_sequence" / "config.pbtxt").read_text()
    string_config = _string_dyna_config(config)
    assert "TYPE_STRING" in string_config and 'backend: "python"' in string_config, string_config
    (qa / "simple_string_dyna_sequence" / "config.pbtxt").write_text(string_config)
    shutil.copytree(qa, full)
    for name in ("repeat_int32", "custom_identity_int32"):
        shutil.copytree(OWN_MODELS / name, full / name)
    _densenet(full / "densenet_onnx", root / "image.png")
    shutil.copytree(qa, qa8)
    shutil.copytree(OWN_MODELS / "custom_identity_int32", qa8 / "custom_identity_int32")
    scripts.mkdir()
    for script in (*SCRIPTS, *CONTROL_SCRIPTS, *NAME_SCRIPTS, "image_client.py", "grpc_image_client.py"):
        (scripts / script).write_bytes(_show(CLIENT_GIT, f"src/python/examples/{script}"))
    return qa, full, scripts, qa8


@pytest.fixture(scope="module")
def assembled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    if not CLIENT_GIT or not SERVER_GIT:
        pytest.skip("TRITON_CLIENT_GIT and TRITON_SERVER_GIT are not both set (git copies of Triton's client "
                    "and server)")  # fmt: skip
    try:
        _show(CLIENT_GIT, "src/python/examples/simple_http_infer_client.py")
        _show(SERVER_GIT, "docs/examples/model_repository/simple/config.pbtxt")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("TRITON_CLIENT_GIT or TRITON_SERVER_GIT is not a git copy of Triton's client or server")
    return _assemble(tmp_path_factory.mktemp("client_examples"))


@pytest.fixture(scope="module")
def server(assembled: tuple[Path, Path, Path, Path]) -> Iterator[ServerProcess]:
    if not all(_port_free(p) for p in (8000, 8001, 8002)):
        pytest.skip("ports 8000, 8001 and 8002, which the example scripts use, are taken")
    doors = ("--grpc", "127.0.0.1:8001", "--http", "127.0.0.1:8000", "--metrics", "127.0.0.1:8002")
    proc = _serve(assembled[1], "127.0.0.1:8000", "127.0.0.1:8001", doors)
    try:
        yield proc
    finally:
        stop_all([proc])


def _serve(repo: Path, http: str, grpc: str, args: tuple[str, ...]) -> ServerProcess:
    """A server whose doors answer, as Triton's qa waits for its server (the broker logs ready first)."""
    from tests.frontdoor_helpers import wait_grpc, wait_http  # imports tritonclient

    proc = start_server(repo, *args, ready_timeout=120)
    try:
        wait_http(http)
        wait_grpc(grpc).close()
    except BaseException:
        stop_all([proc])
        raise
    return proc


def _run(script: Path, args: tuple[str, ...], server: ServerProcess) -> str:
    proc = subprocess.run([sys.executable, script.name, *args], cwd=script.parent, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    print(f"example {script.name} {' '.join(args)}: exit {proc.returncode}")
    detail = proc.stdout[-3000:] + proc.stderr[-3000:] + "\n--- server log ---\n" + server.log()[-3000:]
    assert proc.returncode == 0, detail
    return proc.stdout


@pytest.mark.parametrize(("script", "args"), CASES, ids=[f"{s}{''.join(a)}" for s, a in CASES])
def test_client_example(script: str, args: tuple[str, ...], assembled: tuple[Path, Path, Path, Path],
                        server: ServerProcess) -> None:  # fmt: skip
    path = assembled[2] / script
    out = _run(path, args, server)
    if b"PASS" in path.read_bytes():  # the scripts that print PASS print it only when they pass
        assert "PASS" in out, out[-3000:]


@pytest.mark.parametrize("script", CONTROL_SCRIPTS)
def test_model_control_example(script: str, assembled: tuple[Path, Path, Path, Path]) -> None:
    http, grpc = _free_port(), _free_port()
    doors = ("--grpc", f"127.0.0.1:{grpc}", "--http", f"127.0.0.1:{http}", "--metrics", "127.0.0.1:0")
    explicit = (*doors, "--model-control-mode", "explicit")
    # the HTTP script counts the 7 models of Triton's qa repository, the gRPC one 8 (L0_grpc's has one more)
    repo = assembled[0] if "http" in script else assembled[3]
    proc = _serve(repo, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", explicit)
    try:
        url = f"localhost:{grpc if 'grpc' in script else http}"
        out = _run(assembled[2] / script, ("-v", "-u", url), proc)
        assert "PASS" in out, out[-3000:]
    finally:
        stop_all([proc])


@pytest.mark.parametrize("script", NAME_SCRIPTS)
def test_health_metadata_example(script: str, assembled: tuple[Path, Path, Path, Path],
                                 server: ServerProcess) -> None:  # fmt: skip
    """Unchanged, the script stops at the server name alone; with that one comparison made against
    "zinfer", every other check of it (health, model metadata, the unknown-model text, config) passes."""
    path = assembled[2] / script
    proc = subprocess.run([sys.executable, path.name, "-v"], cwd=path.parent, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout.rstrip().endswith("FAILED : get_server_metadata"), proc.stdout
    text = path.read_text()
    assert text.count('== "triton"') == 1, "the script's server-name check has changed"
    renamed = path.with_name("zinfer_name_" + path.name)
    renamed.write_text(text.replace('== "triton"', '== "zinfer"'))
    _run(renamed, ("-v",), server)


@pytest.mark.parametrize(
    ("script", "args"), IMAGE_CASES, ids=[f"{s}{''.join(a[:2])}" for s, a in IMAGE_CASES]
)  # noqa: E501
def test_image_client_example(script: str, args: tuple[str, ...], assembled: tuple[Path, Path, Path, Path],
                              server: ServerProcess) -> None:  # fmt: skip
    """As Triton's qa runs them, with the stand-in densenet: the top class printed is one the stand-in
    scores highest for the test image, with its label and score."""
    pytest.importorskip("PIL")
    if script == "image_client.py" and "grpc" not in args:
        pytest.importorskip("attrdict", reason="image_client.py over HTTP imports attrdict, not installed")
    from tests.onnx_models import densenet_scores

    out = _run(assembled[2] / script, args, server)
    assert "PASS" in out, out[-3000:]
    image = np.full((1, 224, 224, 3), IMAGE_COLOUR, np.float32).transpose(0, 3, 1, 2)  # NCHW
    scores = densenet_scores(image / 127.5 - 1)[0]  # INCEPTION scaling
    labels = (assembled[1] / "densenet_onnx" / "densenet_labels.txt").read_text().splitlines()
    found = re.findall(r"^ {4}(\S+) \((\d+)\) = (.*)$", out, re.MULTILINE)
    assert len(found) == 1, out[-3000:]
    score, index, label = found[0]
    assert scores[int(index)] == scores.max() and label == labels[int(index)]
    assert float(score) == pytest.approx(float(scores.max()), rel=1e-4, abs=1e-4)
