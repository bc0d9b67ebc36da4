#!/usr/bin/env bash
# The GPU check of issue 19, in one run, on a machine with an NVIDIA GPU and CuPy:
#
#   bash bench/gpu_check.sh            # from the repository root
#
# 1. prints the GPU, the driver and the installed CuPy (nvidia-smi, cupy.show_config);
# 2. checks /dev/shm (the bench needs about 1.5 GiB there; containers default to 64 MiB);
# 3. runs pytest tests/gpu (every GPU test; none may be skipped: a skip here means CuPy or the GPU is not
#    usable, and the script fails), including the 4096^3 GEMM through zinfer against cupy.matmul alone and
#    the compute-stream check;
# 4. runs bench/bench_gpu.py (--quick with QUICK=1), which checks zinfer's outputs against cupy.matmul and
#    writes the figures the issue asks for: GEMM TFLOP/s through zinfer vs cupy.matmul alone (ratios in
#    "ratios"), H2D GB/s from a registered shm region vs a pinned buffer, with and without gpu_prefetch.
#
# Everything it writes goes under $OUT when set (else bench/results/gpu_check/): pytest.log, junit.xml,
# bench.log, bench_gpu.json, env.txt. Python: $PYTHON, else .venv/bin/python, else python3. The exit status
# is that of the first step that failed (0: all passed). TIMEOUT_TESTS / TIMEOUT_BENCH (seconds) bound the
# two steps (defaults 420 and 420).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu_check}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
status=0
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi failed"
    "$py" -c 'import cupy; cupy.show_config()' 2>&1 || echo "CuPy cannot be imported"
    df -h /dev/shm 2>&1
} > "$out/env.txt"
cat "$out/env.txt"

echo "== pytest tests/gpu"
timeout "${TIMEOUT_TESTS:-420}" "$py" -m pytest -v -rs tests/gpu --junitxml="$out/junit.xml" 2>&1 \
    | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
    echo "gpu_check: pytest tests/gpu failed (exit $rc)"
    status=$rc
elif grep -qE "^SKIPPED|[0-9]+ skipped" "$out/pytest.log"; then
    echo "gpu_check: GPU tests were skipped: CuPy or the GPU is not usable here (see the reasons above)"
    status=3
fi

echo "== bench/bench_gpu.py"
quick=()
[ "${QUICK:-0}" = "1" ] && quick=(--quick)
timeout "${TIMEOUT_BENCH:-420}" "$py" bench/bench_gpu.py "${quick[@]}" --out "$out/bench_gpu.json" 2>&1 \
    | tee "$out/bench.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
    echo "gpu_check: bench/bench_gpu.py failed (exit $rc)"
    [ "$status" -eq 0 ] && status=$rc
fi
echo "gpu_check: results in $out (exit $status)"
exit "$status"
