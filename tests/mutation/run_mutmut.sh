#!/usr/bin/env bash
# Mutation testing of the batching policy, descriptor validation, region registration and the worker's region
# cache (docs/testing.md). Run by hand, never by the README's test command:
#   bash tests/mutation/run_mutmut.sh [WORK_DIR] [CHILDREN]
# It needs mutmut (pip install mutmut) in .venv. The package is mutated in a throwaway copy where `zinfer` is a
# plain folder (zinfer/broker, zinfer/workers, ...), so mutmut's module names are the ones the tests import
# and nothing in this checkout is ever changed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-${TMPDIR:-/tmp}/zinfer-mutmut}
CHILDREN=${2:-2}
MUTMUT="$ROOT/.venv/bin/mutmut"
rm -rf "$WORK"
mkdir -p "$WORK/zinfer"
git -C "$ROOT" archive HEAD client modelconfig broker workers tools configs tests | tar -x -C "$WORK"
for p in client modelconfig broker workers tools configs; do mv "$WORK/$p" "$WORK/zinfer/$p"; done
touch "$WORK/zinfer/__init__.py"
cat > "$WORK/pyproject.toml" <<'TOML'
[tool.mutmut]
source_paths = ["zinfer"]
only_mutate = [
    "zinfer/broker/batching/*",
    "zinfer/broker/validation.py",
    "zinfer/broker/regions.py",
    "zinfer/broker/region_intake.py",
    "zinfer/workers/regions.py",
]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:timeout", "-q", "-o", "addopts="]
# the fast unit tests that cover these modules (each mutant runs only those that reach the mutated function)
pytest_add_cli_args_test_selection = [
    "tests/unit/test_batcher.py", "tests/unit/test_priority.py", "tests/unit/test_adaptive.py",
    "tests/unit/test_ordering.py", "tests/unit/test_rate_limiter.py", "tests/unit/test_sequence_batcher.py",
    "tests/unit/test_batch_bytes.py", "tests/unit/test_validation.py", "tests/unit/test_region_handoff.py",
    "tests/unit/test_region_limits.py", "tests/unit/test_batch_runner.py", "tests/unit/test_batcher_held_timeouts.py",
]

[tool.pytest.ini_options]
pythonpath = ["."]
filterwarnings = ["error", "ignore::DeprecationWarning"]
TOML
cd "$WORK"
nice -n 5 "$MUTMUT" run --max-children "$CHILDREN" > run.log 2>&1 || true
"$MUTMUT" results > results.txt 2>/dev/null || true
echo "mutants per status:"
awk -F': ' '{print $2}' results.txt | sort | uniq -c
echo "survivors per module:"
grep ': survived' results.txt | sed 's/^ *//; s/__mutmut.*//; s/\.x[_ǁ].*//' | sort | uniq -c | sort -rn
echo "(mutmut show NAME, run in $WORK, prints a mutant's diff)"
