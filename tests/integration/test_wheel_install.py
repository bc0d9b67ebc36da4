"""A packaged install serves every bundled model: build the wheel, install it in a fresh virtual
environment (not editable, nothing from the checkout on the path), serve its bundled repository.

The wheel is built with pip the way ``pip install .`` builds it (build isolation, setuptools and mypy from
the package index); pip's cache makes the dependencies of the fresh environment a copy, not a download. Where
a C compiler and the Python headers are present (as on CI), its hot modules are compiled with mypyc
(setup.py): the installed server and client then run them compiled, and a build whose compiler fails still
gives a working pure-Python wheel.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MODELS, ROOT, wait_for
from zinfer.broker.compiled import COMPILED
from zinfer.client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # compiling takes minutes on 2 cores
BUILD_TIMEOUT_S = 900

# pip output that means the build could not get its tools (no index reachable), not that the project is broken
_NO_INDEX = ("No matching distribution found for setuptools", "Could not find a version that satisfies")


def _can_compile() -> bool:
    """A C compiler and the Python headers, which mypyc's extension modules need."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()


def _env() -> dict[str, str]:
    """The environment without anything that would put the checkout on a child's path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "ZINFER_COMPILE")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _build_wheel(work: Path, extra_env: dict[str, str]) -> Path:
    """``pip wheel`` of a copy of the checkout without what git ignores (.venv, build outputs, caches)."""
    src = work / "src"
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listing, cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(src)],
        capture_output=True, text=True, env={**_env(), **extra_env}, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    if built.returncode != 0:
        if any(s in built.stdout + built.stderr for s in _NO_INDEX):
            pytest.skip(f"cannot build the wheel here: no package index for its build tools\n{built.stderr}")
        raise AssertionError(f"pip wheel failed:\n{built.stdout}\n{built.stderr}")
    (wheel,) = (work / "dist").glob("zinfer-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with zinfer installed from the wheel just built; yields its ``bin`` folder."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(work, {})
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=_env())
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True, text=True, env=_env(), timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, f"installing the wheel failed:\n{done.stdout}\n{done.stderr}"
    yield venv / "bin"
    shutil.rmtree(work, ignore_errors=True)


def _run(python: Path, code: str) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=python.parent,
                          env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_wheel_holds_every_bundled_model_folder(installed: Path) -> None:
    """Every version folder of configs/models is in the install, the ones holding only .gitkeep too."""
    code = "import zinfer.configs, os; print(os.path.dirname(zinfer.configs.__file__))"
    where = _run(installed / "python", code)
    assert where.startswith(str(installed.parent)), f"zinfer imported from {where}, not from the fresh venv"
    packaged_models = Path(where) / "models"
    shipped = {p.relative_to(MODELS) for p in MODELS.glob("*/*") if p.is_dir()}
    packaged = {p.relative_to(packaged_models) for p in packaged_models.glob("*/*") if p.is_dir()}
    assert shipped <= packaged, f"missing from the wheel: {sorted(map(str, shipped - packaged))}"


def test_the_wheel_runs_its_hot_modules_compiled(installed: Path) -> None:
    """With a compiler here, every module of zinfer.broker.compiled.COMPILED imports from an extension module
    in the fresh venv (not from a .py, not from the checkout); the .py files are shipped beside them."""
    code = "from zinfer.broker import compiled as c; print(len(c.compiled_here()), len(c.COMPILED))"
    assert _run(installed / "python", code) == (
        f"{len(COMPILED)} {len(COMPILED)}" if _can_compile() else f"0 {len(COMPILED)}"
    )
    where = _run(installed / "python", "import zinfer.client.protocol as p; print(p.__file__)")
    assert where.startswith(str(installed.parent)), where


def test_a_packaged_install_serves_every_bundled_model(installed: Path, tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [str(installed / "zinfer"), "serve", "--runtime-dir", str(runtime), "--metrics", "127.0.0.1:0"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, env=_env(),
        )  # fmt: skip
    try:
        wait_for(lambda: "event=ready" in log_path.read_text() or proc.poll() is not None, 90, "readiness")
        assert proc.poll() is None, log_path.read_text()
        models = sorted(p.name for p in MODELS.iterdir() if (p / "config.pbtxt").is_file())
        with Client(f"ipc://{runtime / 'zinfer.sock'}", timeout=30) as client:
            states = {r["name"]: (r["state"], r["reason"]) for r in client.repository_index()}
            not_ready = {m: states.get(m) for m in models if states.get(m, ("", ""))[0] != "READY"}
            assert not not_ready, f"bundled models not ready from the wheel: {not_ready}"
            assert all(client.is_model_ready(m) for m in models)
            assert client.is_server_ready()
            # the README's first call, on the packaged models
            a = np.array([[1.0], [2.0]], np.float32)
            out = client.infer("add", {"INPUT_A": a, "INPUT_B": a}).as_numpy("OUTPUT_SUM")
            assert out.tolist() == [[2.0], [4.0]]
        # the installed (compiled) client too, sync and asyncio, inline and shared-memory tensors
        code = (
            "import asyncio, numpy as np\n"
            "from zinfer.client import AsyncClient, Client\n"
            f"url = 'ipc://{runtime / 'zinfer.sock'}'\n"
            "with Client(url, timeout=30) as c:\n"
            "    a = np.array([[1.0], [2.0]], np.float32)\n"
            "    print(c.infer('add', {'INPUT_A': a, 'INPUT_B': a}).as_numpy('OUTPUT_SUM').tolist())\n"
            "    x = c.empty((1, 1 << 16), np.float32); x[:] = 1.0\n"
            "    print(float(c.infer('identity', {'INPUT0': x}).as_numpy('OUTPUT0').sum()))\n"
            "async def go():\n"
            "    async with AsyncClient(url, timeout=30) as c:\n"
            "        a = np.ones((1, 1), np.float32)\n"
            "        calls = (c.infer('add', {'INPUT_A': a, 'INPUT_B': a * i}) for i in range(8))\n"
            "        rs = await asyncio.gather(*calls)\n"
            "        print([float(r.as_numpy('OUTPUT_SUM')[0, 0]) for r in rs])\n"
            "asyncio.run(go())\n"
        )
        assert _run(installed / "python", code).splitlines() == [
            "[[2.0], [4.0]]",
            "65536.0",
            str([1.0 + i for i in range(8)]),
        ]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(5)
    assert code == 0, log_path.read_text()
    log = log_path.read_text()
    assert "event=model_load_failed" not in log
    n = len(COMPILED) if _can_compile() else 0
    assert f"compiled={n}/{len(COMPILED)}" in log, log


# the tests that hand the protocol and the server hostile input: on a compiled build a wrong annotation is a
# TypeError at run time (an INTERNAL reply) where pure Python went on to the check that names the field
HOSTILE_INPUT_TESTS = (
    "tests/unit/test_wire_fast_paths.py",
    "tests/unit/test_protocol.py",
    "tests/unit/test_bundle_wire.py",
    "tests/unit/test_wire_records.py",
    "tests/integration/test_bad_input.py",
    # the HTTP door's connections (httptools installed beside the wheel): hostile heads, bodies and stalls
    "tests/unit/test_http_wire.py",
    "tests/unit/test_http_wire_start.py",
    "tests/unit/test_http_wire_kept.py",
)


def test_the_hostile_input_tests_pass_on_the_installed_build(installed: Path) -> None:
    """The protocol's and the server's bad-input tests, run by the fresh venv's python (its zinfer is the
    wheel's, compiled where a compiler is here) from the copy the wheel was built from."""
    tools = ["pytest>=7.4", "pytest-timeout>=2.2", "hypothesis>=6.0", "httptools>=0.6"]
    done = subprocess.run([str(installed / "python"), "-m", "pip", "install", "-q", *tools],
                          capture_output=True, text=True, env=_env(), timeout=300)  # fmt: skip
    if done.returncode != 0 and any(s in done.stdout + done.stderr for s in _NO_INDEX):
        pytest.skip(f"cannot install pytest into the fresh venv: no package index\n{done.stderr}")
    assert done.returncode == 0, done.stderr
    src = installed.parent.parent / "src"
    code = "import zinfer.client.protocol as p; print(p.__file__)"
    assert _run(installed / "python", code).startswith(str(installed.parent))
    # in this process: the checkout's addopts ask for pytest-xdist, which this venv has not
    pytest_cmd = [str(installed / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    ran = subprocess.run(
        [*pytest_cmd, *HOSTILE_INPUT_TESTS],
        capture_output=True, text=True, cwd=src, env=_env(), timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]


def test_a_wheel_whose_compiler_fails_is_pure_python_and_whole(tmp_path: Path) -> None:
    """A compiler that fails every call (CC=false) leaves a wheel with no extension module and every .py."""
    wheel = _build_wheel(tmp_path, {"CC": "false", "LDSHARED": "false"})
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")], names
    for module in COMPILED:
        assert module.replace(".", "/") + ".py" in names, module
    assert "-py3-none-any.whl" in wheel.name or "-cp3" in wheel.name, wheel.name
