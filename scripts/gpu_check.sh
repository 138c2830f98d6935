#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one call: install what tcc needs, run the whole test suite
# (CUDA tests included, on WORKERS=8 processes), the CUDA differential fuzzer (FUZZ=200 programs from
# START), then every GPU-side benchmark (Step 6 workloads with the roofline, the CUDA latency rows,
# PyTorch call overhead and conv gradients on CUDA, the ONNX networks against eager PyTorch,
# torch.compile(backend="tcc") against eager and Inductor, CUDA dynamic kernels against specialised), each
# under a time limit so that the whole fits one 10-minute device call. Logs go to $OUT (if set) or
# ./gpu-check-logs; each benchmark's output to its own log.
#
#   bash scripts/gpu_check.sh            # tests, then benchmarks
#   TESTS=0 bash scripts/gpu_check.sh    # benchmarks only
#   BENCH=0 bash scripts/gpu_check.sh    # tests only
#   TESTS=0 FUZZ=0 ONLY="gpu attention" bash scripts/gpu_check.sh   # the named benchmarks only
#
# Offline machines: put wheels in .whl/ first (lark, llvmlite, ...; see docs); they are installed
# into /tmp/tcc-site with --no-deps. Online machines: pip installs tcc[cuda,dev] instead.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu-check-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" > /dev/null; then
    # into the interpreter's own environment, so that subprocesses of the tests see them too
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tcc-site \
            .whl/*.whl || { echo "gpu_check: installing the carried wheels failed"; exit 2; }
        export PYTHONPATH="/tmp/tcc-site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    "$PY" -m pip install -q -e ".[cuda,dev]" || { echo "gpu_check: pip install failed"; exit 2; }
fi
export PYTHONUNBUFFERED=1
export TCC_CACHE_DIR="$(mktemp -d)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("numpy", "lark", "llvmlite", "cuda.bindings", "torch"):
    try:
        m = importlib.import_module(name)
        print(f"{name:14s}", getattr(m, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(f"{name:14s} MISSING ({exc})")
from cuda.bindings import nvrtc
print("nvrtc         ", nvrtc.nvrtcVersion()[1:])
import tcc
print("tcc.cuda.is_available():", tcc.cuda.is_available())
PY

status=0
if [ "${TESTS:-1}" != 0 ]; then
    "$PY" -m pytest -q -rsfE -n "${WORKERS:-8}" -p no:cacheprovider --junitxml="$LOGS/junit.xml" tests 2>&1 \
        | tee "$LOGS/pytest.log" | tail -25
    status=${PIPESTATUS[0]}
fi
if [ "${FUZZ:-200}" != 0 ]; then  # the differential fuzzer on CUDA: N random programs against the reference
    PYTHONPATH="$PWD/tests:$PYTHONPATH" timeout 240 "$PY" -m fuzz -n "${FUZZ:-200}" --target cuda --workers 8 \
        --start "${START:-16000}" 2>&1 | tee "$LOGS/fuzz_cuda.log" | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

bench=0
if [ "${BENCH:-1}" != 0 ]; then
    run_bench() {  # NAME CMD...: one benchmark, its output in $LOGS/NAME.log, a failure remembered
        local name=$1; shift
        case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac  # ONLY="gpu scan": those alone
        echo "==== $name: $*"
        "$@" 2>&1 | tee "$LOGS/$name.log"
        [ "${PIPESTATUS[0]}" = 0 ] || bench=1
    }
    cd benchmarks
    run_bench gpu timeout 200 "$PY" gpu.py --trials "${TRIALS:-3}" --roofline --png "$LOGS/roofline.png"
    run_bench latency timeout 150 "$PY" latency.py --cuda --runs 3 --no-cpu-starts
    run_bench torch_overhead timeout 60 "$PY" torch_overhead.py --cuda --runs 5
    run_bench grad timeout 90 "$PY" grad.py --cuda --runs 5 --layer "3x3 64"
    run_bench onnx_networks timeout 120 "$PY" onnx_networks.py --cuda --repeat 30
    run_bench models timeout 150 "$PY" models.py --cuda --models mlp cnn gpt --batches 8 --repeat 20
    run_bench language timeout 150 "$PY" language.py --device cuda --runs 5
    run_bench scan timeout 60 "$PY" scan.py --device cuda --rows 64 --length 16384
    run_bench attention timeout 200 "$PY" attention.py --device cuda --seq 2048 4096 --trials 3
    run_bench dynamic timeout 90 "$PY" dynamic.py --target cuda --parts kernels --cases softmax,layernorm,matmul_M \
        --sizes 7,1000,8192 --rounds 5
    cd ..
fi
echo "gpu_check: pytest exit $status, benchmarks exit $bench"
exit $(( status != 0 ? status : bench ))
