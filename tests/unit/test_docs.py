"""The docs stay true to the code: every flag they name exists, every test docs/reliability.md names exists,
.ci/run runs the README's test command verbatim, and systemd snippets carry no inline comments.
(The examples themselves run in tests/integration/test_doc_examples.py.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = ("serve", "perf", "tune", "status", "models", "load", "unload", "keys")
# flags of other programs the docs name: systemctl, the bench/ scripts, mypy
OTHER_TOOLS = {"--now", "--quick", "--strict"}
# a flag that the docs name but zinfer does not have; each entry must still be in the docs (remove it then)
KNOWN_WRONG: dict[str, str] = {}  # flag -> why the docs may name it although no --help lists it


def _text(doc: Path) -> str:
    return re.sub(r"<!--.*?-->", "", doc.read_text(), flags=re.S)  # not the pytest marks


def _help_flags() -> set[str]:
    flags: set[str] = set()
    for sub in SUBCOMMANDS:
        done = subprocess.run([sys.executable, "-m", "zinfer.broker", sub, "--help"], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, done.stderr
        flags |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", done.stdout))
    return flags


def test_every_flag_the_docs_name_is_in_zinfer_help() -> None:
    named = {f: d.name for d in DOCS for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", _text(d))}
    known = _help_flags()
    unknown = {f: doc for f, doc in named.items() if f not in known | OTHER_TOOLS | set(KNOWN_WRONG)}
    assert not unknown, f"flags named in the docs that no 'zinfer ... --help' lists: {unknown}"
    stale = set(KNOWN_WRONG) - set(named)
    assert not stale, f"fixed in the docs, drop from KNOWN_WRONG: {stale}"


def _reliability_tests() -> list[str]:
    entries = []
    for line in (ROOT / "docs" / "reliability.md").read_text().splitlines():
        if not re.match(r"\|\s*\d+\s*\|", line):
            continue
        last = line.rstrip().rstrip("|").rsplit("|", 1)[-1]
        entries += re.findall(r"`([^`]+)`", last)
    return entries


def test_reliability_md_names_tests_and_files_that_exist() -> None:
    entries = _reliability_tests()
    assert len(entries) > 30
    missing = []
    for entry in entries:
        file, _, test = entry.partition("::")
        if "/" in file:
            found = [ROOT / file] if (ROOT / file).is_file() else []
        else:
            found = list((ROOT / "tests").rglob(file))
        if not found:
            missing.append(entry)
            continue
        if test:
            trees = [ast.parse(p.read_text()) for p in found]
            names = {n.name for tree in trees for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            if test not in names:
                missing.append(entry)
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


def _readme_test_command() -> str:
    blocks = [b for b in extract_from_file(ROOT / "README.md") if b.syntax == "bash"]
    (block,) = [b for b in blocks if "pytest" in b.code]
    (command,) = [line for line in block.code.splitlines() if line and not line.startswith("#")]
    return command


def test_ci_runs_exactly_the_readme_test_command() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_test_command() in lines


def test_readme_first_commands_install_and_serve_and_test() -> None:
    blocks = [b.code for b in extract_from_file(ROOT / "README.md") if b.syntax == "bash"][:2]
    assert "pip install -e ." in blocks[0] and "zinfer serve" in blocks[0]
    assert "python -m pytest" in blocks[1]


@pytest.mark.parametrize("doc", [d for d in DOCS if "```ini" in d.read_text()], ids=lambda d: d.name)
def test_systemd_snippets_have_no_inline_comments(doc: Path) -> None:
    """systemd takes '#' and ';' comments only at the start of a line: 'After=x  # why' is a bad value."""
    for block in extract_from_file(doc):
        if block.syntax != "ini":
            continue
        for line in block.code.splitlines():
            if "=" in line and not line.lstrip().startswith(("#", ";")):
                assert " #" not in line and " ;" not in line, f"{doc.name}:{block.lineno}: {line!r}"
