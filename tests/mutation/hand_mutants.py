"""Mutants applied by hand, each with the test that must kill it (docs/testing.md, "Survivors").

mutmut's survivors that got a test of their own are kept here as edits of the code, so anyone can check that
each test still fails when its behaviour breaks. Run by hand, never by the README's test command:

    .venv/bin/python tests/mutation/hand_mutants.py [WORK_DIR]

The committed package is copied into WORK_DIR as a plain ``zinfer/`` folder (as ``run_mutmut.sh`` does);
each mutant is applied there, its test run, and the file restored. Nothing in this checkout is changed.
Exit status 1 when a mutant survives.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("client", "modelconfig", "broker", "workers", "tools", "configs")
PYPROJECT = """
[tool.pytest.ini_options]
pythonpath = ["."]
filterwarnings = ["error", "ignore::DeprecationWarning"]
"""
DROP = "tests/unit/test_region_limits.py::test_dropping_a_connection_that_holds_no_region_drops_nothing"
BYTES = "tests/unit/test_validation.py::test_bytes_inputs_need_at_least_a_length_prefix_per_element"
KEY = "tests/unit/test_validation.py::test_shape_keys_ignore_the_batch_dim_only_when_the_model_batches"
CONNS = "tests/unit/test_region_handoff.py::test_hand_off_connections_are_held_up_to_each_ceiling"
DROPPED = "list(self._by_client.get(client, {}).values())"
SHAPE = "seen[name].shape[1:] if batching else seen[name].shape"
REFUSED = "self._refused[over] += 1  # counted, logged by ``expire``\n                "
# (file in the package, text, its mutant, the test that must fail)
MUTANTS = [
    ("broker/regions.py", DROPPED, "list(self._by_client.get(client, None).values())", DROP),
    ("broker/regions.py", DROPPED, "list(self._by_client[client].values())", DROP),
    ("broker/validation.py", "if nbytes < 4 * count:", "if nbytes <= 4 * count:", BYTES),
    ("broker/validation.py", "if nbytes < 4 * count:", "if nbytes < 3 * count:", BYTES),
    ("broker/validation.py", "if nbytes < 4 * count:", "if nbytes < 5 * count:", BYTES),
    ("broker/validation.py", SHAPE, "seen[name].shape[1:] if batching else seen[name].shape[1:]", KEY),
    ("broker/validation.py", SHAPE, "seen[name].shape[1:] if not batching else seen[name].shape", KEY),
    ("broker/validation.py", SHAPE, "seen[name].shape[2:] if batching else seen[name].shape", KEY),
    ("broker/region_intake.py", "self._pid[pid] >= per_pid", "self._pid[pid] > per_pid", CONNS),
    ("broker/region_intake.py", "self._uid[uid] >= per_uid", "self._uid[uid] > per_uid", CONNS),
    ("broker/region_intake.py", "self.total >= total", "self.total > total", CONNS),
    ("broker/region_intake.py", REFUSED + "continue", REFUSED + "break", CONNS),
]


def _copy(work: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", *PACKAGES, "tests"], check=True,
                             capture_output=True, timeout=120).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True, timeout=120)
    (work / "zinfer").mkdir()
    for p in PACKAGES:
        (work / p).rename(work / "zinfer" / p)
    (work / "zinfer" / "__init__.py").touch()
    (work / "pyproject.toml").write_text(PYPROJECT)


def main(work: Path) -> int:
    _copy(work)
    survived = 0
    for file, text, mutant, test in MUTANTS:
        path = work / "zinfer" / file
        original = path.read_text()
        if original.count(text) != 1:
            print(f"STALE   {file}: {text!r} is not in the code once: update this list")
            survived += 1
            continue
        path.write_text(original.replace(text, mutant))
        try:
            command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts="]
            done = subprocess.run([*command, test], cwd=work, capture_output=True, text=True, timeout=300)
        finally:
            path.write_text(original)
        killed = done.returncode == 1  # the test failed; 2+ (collection or usage errors) proves nothing
        survived += not killed
        print(f"{'killed  ' if killed else 'SURVIVED'} {file}: {mutant.strip()!r} by {test.split('::')[1]}")
    return 1 if survived else 0


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="zinfer-hand-mutants-"))
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        sys.exit(f"{folder} is not empty")
    try:
        sys.exit(main(folder))
    finally:
        if len(sys.argv) <= 1:
            shutil.rmtree(folder, ignore_errors=True)
