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
OTHER_TOOLS = {"--now", "--quick", "--strict", "--triton-venv", "--loads", "--on-demand"}
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


RELIABILITY = ROOT / "docs" / "reliability.md"


def _reliability_rows() -> dict[int, list[str]]:
    """Each row of docs/reliability.md's scenario table: its number -> the entries its last cell names."""
    rows: dict[int, list[str]] = {}
    for line in RELIABILITY.read_text().splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|", line)
        if not m:
            continue
        last = line.rstrip().rstrip("|").rsplit("|", 1)[-1]
        leftover = re.sub(r"`[^`]+`", "", last).replace(",", "").strip()
        assert not leftover, f"row {m.group(1)}: the Test cell holds more than `entries`: {leftover!r}"
        assert int(m.group(1)) not in rows, f"row {m.group(1)} appears twice"
        rows[int(m.group(1))] = re.findall(r"`([^`]+)`", last)
    return rows


def _test_functions(path: Path) -> set[str]:
    """The test functions pytest would collect by name from one file: module-level ``test_*`` functions."""
    tree = ast.parse(path.read_text())
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def _missing_tests(rows: dict[int, list[str]]) -> dict[int, list[str]]:
    """Per row, what is wrong: no test named, an entry that is not FILE.py::TEST, a file or test not found,
    a ``bench/`` script named beside the tests (a benchmark run by hand, e.g. row 27's soak) missing."""
    files: dict[str, list[Path]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        files.setdefault(path.name, []).append(path)
    wrong: dict[int, list[str]] = {}
    for row, entries in rows.items():
        problems = []
        benches = [e for e in entries if e.startswith("bench/")]
        problems += [f"{b}: no such benchmark script" for b in benches if not (ROOT / b).is_file()]
        tests = [e for e in entries if e not in benches]
        if not tests:
            problems.append("names no test")
        for entry in tests:
            file, sep, test = entry.partition("::")
            if not sep or not test.startswith("test_") or not file.endswith(".py"):
                problems.append(f"{entry}: not FILE.py::test_name")
            elif len(files.get(file, [])) != 1:
                problems.append(f"{entry}: {len(files.get(file, []))} files named {file} under tests/")
            elif test not in _test_functions(files[file][0]):
                problems.append(f"{entry}: no test function {test} in {files[file][0].relative_to(ROOT)}")
        if problems:
            wrong[row] = problems
    return wrong


def test_every_reliability_row_names_tests_that_exist() -> None:
    """docs/reliability.md names, for each row, the tests that exercise exactly that row: every row names at
    least one ``FILE.py::test_name``, and each one is a test function in that file under tests/."""
    rows = _reliability_rows()
    assert sorted(rows) == list(range(1, len(rows) + 1)) and len(rows) > 50, sorted(rows)
    wrong = _missing_tests(rows)
    assert not wrong, f"docs/reliability.md rows naming no test or tests that do not exist: {wrong}"


def test_the_reliability_check_catches_a_missing_or_wrong_test() -> None:
    """The check above is not vacuous: a row without a test, a bare file, a misspelt test, a helper that is
    not a test, a file that does not exist, a benchmark alone and a benchmark that does not exist are each
    reported, and neither the table's real first row nor that row with a real benchmark beside it is."""
    real = _reliability_rows()
    first = real[1]
    assert (
        first and not _missing_tests({1: first}) and not _missing_tests({1: [*first, "bench/bench_soak.py"]})
    )
    file = first[0].partition("::")[0]
    bad = {
        1: [],
        2: [file],
        3: [first[0] + "_not"],
        4: [f"{file}::{first[0].partition('::')[2].removeprefix('test_')}"],
        5: ["test_no_such_file.py::test_x"],
        7: ["bench/bench_soak.py"],
        8: [*first, "bench/no_such_bench.py"],
    }
    assert sorted(_missing_tests({**bad, 6: first})) == [1, 2, 3, 4, 5, 7, 8]


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
