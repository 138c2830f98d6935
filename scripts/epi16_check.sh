#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (under 4 minutes): the tests of the staged and paired GEMM result
# stores (tests/test_cuda_staged_stores.py) and of the tensor-core GEMMs whose 16-bit results they
# now store (tensor cores, FP8, the epilogue fusion), then the GEMM and GELU rows of
# benchmarks/gpu.py with staged_stores="auto" (16-bit results through shared memory) and "off"
# (stored straight from the accumulators, in column pairs), then the f16-out GEMM and GELU rows
# compiled for 113 KiB of shared memory a block (128 x 128 tiles in 3 slots: two blocks a
# multiprocessor, one's epilogue beside the other's main loop). ALL=1 adds a run with "all" (f32
# results staged too). Logs go to $OUT (if set) or ./epi16-logs.
#
#   bash scripts/epi16_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/epi16-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" > /dev/null; then  # (as scripts/gpu_check.sh installs them)
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tcc-site \
            .whl/*.whl || { echo "epi16_check: installing the carried wheels failed"; exit 2; }
        export PYTHONPATH="/tmp/tcc-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    "$PY" -m pip install -q -e ".[cuda,dev]" || { echo "epi16_check: pip install failed"; exit 2; }
fi
export PYTHONUNBUFFERED=1
export TCC_CACHE_DIR="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

timeout 60 "$PY" -m pytest -q -rfE -n "${WORKERS:-8}" -p no:cacheprovider tests/test_cuda_staged_stores.py \
    tests/test_cuda_tensor_cores.py tests/test_fp8.py tests/test_cuda_epilogue_fusion.py 2>&1 \
    | tee "$LOGS/pytest.log" | tail -15
status=${PIPESTATUS[0]}

bench=0
cd benchmarks
run() {  # LOG LIMIT ENV... -- ARGS...: one run of gpu.py, its output in $LOGS/LOG.log
    local log=$1 limit=$2; shift 2
    echo "==== $log"
    env "$@" timeout "$limit" "$PY" gpu.py --trials 3 --no-compile "${ROWS[@]}" 2>&1 | tee "$LOGS/$log.log"
    [ "${PIPESTATUS[0]}" = 0 ] || bench=1
}
ROWS=(-k "GEMM" -k "GELU")
run gpu_auto 75 TCC_BENCH_STAGED_STORES=auto
run gpu_off 75 TCC_BENCH_STAGED_STORES=off
[ -n "${ALL:-}" ] && run gpu_all 75 TCC_BENCH_STAGED_STORES=all
ROWS=(-k "f16 out" -k "GELU")
run gpu_113kib 30 TCC_BENCH_STAGED_STORES=auto TCC_BENCH_SHARED_KIB=113
echo "epi16_check: pytest exit $status, benchmarks exit $bench"
exit $(( status != 0 ? status : bench ))
