#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the tests of the CUDA shape-generic kernels (kernels by the range
# of a dynamic size: row lengths, a GEMM's M), then benchmarks/dynamic.py's CUDA kernels against the
# specialised ones (dynamic / specialised throughput; the target is >= 0.9 at every size), in under four
# minutes. Logs go to $OUT (if set) or ./dyncuda-check-logs.
#
#   bash scripts/dyncuda_check.sh
#   TESTS=0 bash scripts/dyncuda_check.sh    # the benchmark only
#
# Installs what tcc needs as scripts/gpu_check.sh does (carried wheels in .whl/, else pip).
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/dyncuda-check-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" > /dev/null; then
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tcc-site \
            .whl/*.whl || { echo "dyncuda_check: installing the carried wheels failed"; exit 2; }
        export PYTHONPATH="/tmp/tcc-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    "$PY" -m pip install -q -e ".[cuda,dev]" || { echo "dyncuda_check: pip install failed"; exit 2; }
fi
export PYTHONUNBUFFERED=1
export TCC_CACHE_DIR="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

status=0
if [ "${TESTS:-1}" != 0 ]; then
    workers=()
    "$PY" -c "import xdist" 2>/dev/null && workers=(-n "${WORKERS:-8}")
    timeout 80 "$PY" -m pytest -q -rfE ${workers[@]+"${workers[@]}"} -p no:cacheprovider \
        tests/test_cuda_dynamic_gpu.py tests/test_cuda_dynamic.py tests/test_cuda_split_k.py \
        tests/test_cuda_gemm_tiles.py tests/test_cuda_row_registers.py tests/test_cuda_launch.py \
        tests/test_cuda_merge_kernels.py 2>&1 | tee "$LOGS/pytest.log" | tail -25
    status=${PIPESTATUS[0]}
fi

bench=0
cd benchmarks
# the issue's command (sizes along the dynamic axis: rows, or M), then more sizes, the row length, a
# convolution's batch (its own sizes), an f16 GEMM's M
for args in "--cases softmax,layernorm,matmul_M --sizes 7,1000,8192" \
            "--cases softmax,layernorm,matmul_M,softmax_row --sizes 1,33,4096" \
            "--cases conv_N,hmm_M --sizes 7,1000,8192"; do
    echo "==== dynamic.py --target cuda --parts kernels $args --rounds 5"
    # shellcheck disable=SC2086
    timeout 50 "$PY" dynamic.py --target cuda --parts kernels $args --rounds 5 2>&1 | tee -a "$LOGS/dynamic.log"
    [ "${PIPESTATUS[0]}" = 0 ] || bench=1
done
cd ..
echo "dyncuda_check: pytest exit $status, benchmark exit $bench"
exit $(( status != 0 ? status : bench ))
