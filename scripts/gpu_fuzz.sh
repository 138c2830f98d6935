#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the differential fuzzer on CUDA (N programs, default 1000),
# then compute-sanitizer (memcheck, racecheck) over the CUDA tests of the examples and a small
# fuzz batch. Logs go to $OUT (if set) or ./gpu-check-logs; a summary is printed last.
#
#   N=1000 bash scripts/gpu_fuzz.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu-check-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
N="${N:-1000}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tcc-site \
        .whl/*.whl || { echo "gpu_fuzz: installing the carried wheels failed"; exit 2; }
    export PYTHONPATH="/tmp/tcc-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TCC_CACHE_DIR="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

timeout 420 "$PY" -m fuzz -n "$N" --target cuda --schedules 0 --workers 8 --start "${START:-0}" --show-rejected \
    > "$LOGS/fuzz_cuda.log" 2> "$LOGS/fuzz_cuda.err"
fuzz=$?
# --report-api-errors no: cuda-python probes driver entry points that do not exist (cuGetProcAddress
# answers "invalid argument"); those are not errors of tcc's kernels
SAN="compute-sanitizer --target-processes all --print-limit 20 --error-exitcode 99 --report-api-errors no"
timeout 300 $SAN --tool memcheck "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py \
    -k "example or tiled or tensor_core or integer or bf16" > "$LOGS/memcheck_tests.log" 2>&1
mem=$?
timeout 200 $SAN --tool racecheck "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py \
    -k "example or tiled or tensor_core" > "$LOGS/racecheck_tests.log" 2>&1
race=$?
timeout 240 $SAN --tool memcheck "$PY" -m fuzz -n 40 --target cuda --schedules 0 --workers 1 --start 5000 \
    > "$LOGS/memcheck_fuzz.log" 2>&1
memf=$?
echo "==== summary"
grep -h "^seed" "$LOGS/fuzz_cuda.log" | head -30
tail -n 1 "$LOGS/fuzz_cuda.log"
for f in memcheck_tests racecheck_tests memcheck_fuzz; do
    echo "-- $f: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|programs:' "$LOGS/$f.log" | tail -n 3 | tr '\n' ' ')"
done
echo "gpu_fuzz: fuzz exit $fuzz, memcheck tests $mem, racecheck tests $race, memcheck fuzz $memf"
