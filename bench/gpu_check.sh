#!/usr/bin/env bash
# The GPU proof kit (#23) in one device call: tests/e2e/test_gpu.py, then figure 15
# (`python -m bench --only gpu`), everything teed to $OUT. Run from the repository root:
#
#     bash bench/gpu_check.sh
#
# Made for a GPU machine with torch preinstalled system-wide and no network: the
# project is used from the checkout (PYTHONPATH), not installed. Besides torch the
# bench and the tests need cloudpickle and fsspec (the project's dependencies) and, for
# the tests, pytest (+ pluggy, iniconfig, packaging, Pygments) and pytest-timeout;
# numpy is optional (nothing here needs it). Wheels found in .whl/ are installed into
# $GPU_CHECK_SITE (default /tmp/site) first, each on its own: one that does not fit this
# Python is skipped.
# Download them beforehand, on a machine with network, for the device's Python (3.12):
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#         cloudpickle==3.1.3 fsspec==2026.9.0 pytest==9.2.0 pytest-timeout==2.4.0 \
#         pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0 numpy==2.4.6
#
# (the versions of .ci/constraints.txt). .whl/ is git-ignored: a device call must carry it
# (run's carry=[".whl"]).
#
# Time: at most GPU_CHECK_TOTAL_S (default 540) in all; the tests get at most
# GPU_CHECK_TESTS_S (default 240), the bench the rest, and stops starting repetitions
# that would not end in time (BENCH_GPU_BUDGET_S). GPU_CHECK_ONLY=tests|bench runs one
# part; GPU_CHECK_BENCH_ARGS adds arguments to the bench (e.g. "--repeat 1", "--smoke"). Output in $OUT (default /tmp/gpu_check): env.log, test_gpu.log, bench.log,
# gpu.md, and the logs of failed bench runs.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PYTHON:-python3}
TOTAL_S=${GPU_CHECK_TOTAL_S:-540}
TESTS_S=${GPU_CHECK_TESTS_S:-240}
ONLY=${GPU_CHECK_ONLY:-}
SITE=${GPU_CHECK_SITE:-/tmp/site}
read -r -a BENCH_ARGS <<< "${GPU_CHECK_BENCH_ARGS:-}"
mkdir -p "$OUT"
START=$(date +%s)
remaining() { echo $((TOTAL_S - ($(date +%s) - START))); }

{
    echo "== $(date -u '+%F %T UTC') $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi 2>/dev/null || echo "nvidia-smi: not found"
    "$PY" --version
    if compgen -G ".whl/*.whl" >/dev/null; then
        for wheel in .whl/*.whl; do
            "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$wheel" \
                || echo "wheel skipped: $wheel"
        done
        export PYTHONPATH=$SITE:$PWD
    else
        echo "no .whl/: using what $PY has"
        export PYTHONPATH=$PWD
    fi
    echo "PYTHONPATH=$PYTHONPATH"
    # A separate process: the CUDA calls here poison nothing the checks fork.
    "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'devices', torch.cuda.device_count(), [torch.cuda.get_device_name(i) \
for i in range(torch.cuda.device_count())])"
    for module in cloudpickle fsspec pytest pytest_timeout numpy; do
        "$PY" -c "import $module as m; print('$module', getattr(m, '__version__', '?'))" \
            2>/dev/null || echo "$module: MISSING"
    done
} 2>&1 | tee "$OUT/env.log"
export PYTHONPATH=$( [ -d "$SITE" ] && echo "$SITE:$PWD" || echo "$PWD")

status=0
if [ "$ONLY" != bench ]; then
    echo "== tests/e2e/test_gpu.py (at most ${TESTS_S} s)" | tee "$OUT/test_gpu.log"
    timeout -k 10 "$TESTS_S" "$PY" -m pytest -v -rA --durations=0 -p no:cacheprovider \
        tests/e2e/test_gpu.py 2>&1 | tee -a "$OUT/test_gpu.log"
    code=$?
    echo "== pytest exit code $code" | tee -a "$OUT/test_gpu.log"
    [ "$code" -eq 0 ] || status=1
fi
if [ "$ONLY" != tests ]; then
    left=$(remaining)
    echo "== python -m bench --only gpu (at most ${left} s)" | tee "$OUT/bench.log"
    BENCH_GPU_BUDGET_S=$((left - 30)) timeout -k 10 "$left" \
        "$PY" -m bench --only gpu --output "$OUT/gpu.md" "${BENCH_ARGS[@]}" 2>&1 \
        | tee -a "$OUT/bench.log"
    code=$?
    echo "== bench exit code $code" | tee -a "$OUT/bench.log"
    [ "$code" -eq 0 ] || status=1
    find /tmp -maxdepth 1 -name 'bench-failed-*.log' -newer "$OUT/env.log" \
        -exec cp {} "$OUT/" \;  # this run's failed bench runs
fi
echo "== done in $(($(date +%s) - START)) s, status $status"
exit $status
