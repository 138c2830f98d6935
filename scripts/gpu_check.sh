#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: install what tcc needs, run the whole test suite (CUDA tests
# included) and the CUDA benchmark. Logs go to $OUT (if set) or ./gpu-check-logs.
#
#   bash scripts/gpu_check.sh
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

"$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$LOGS/junit.xml" tests 2>&1 | tee "$LOGS/pytest.log"
status=${PIPESTATUS[0]}

"$PY" benchmarks/cuda_kernels.py 2>&1 | tee "$LOGS/bench.log"
bench=${PIPESTATUS[0]}
echo "gpu_check: pytest exit $status, benchmark exit $bench"
exit $(( status != 0 ? status : bench ))
