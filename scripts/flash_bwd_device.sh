#!/bin/sh
# The device check of tcc.grad of 16-bit attention on FlashAttention-2's backward template (issue 26,
# item 3): its GPU tests, then the backward rows of benchmarks/attention.py against SDPA's backward.
# Run from the repository root on a CUDA machine (about 3-4 minutes on an H200, most of it compiling).
set -e
export TCC_CACHE_DIR="${TCC_CACHE_DIR:-/tmp/tcc-cache-flash-bwd}"
PY="${PYTHON:-python}"
"$PY" -m pytest -q -rfE tests/test_attention_grad_gpu.py -k half tests/test_attention_grad_matrix.py
"$PY" benchmarks/attention.py --device cuda --no-forward --no-compile --trials 5 --dtypes f16 --seq 2048 8192
"$PY" benchmarks/attention.py --device cuda --no-forward --no-compile --trials 5 --dtypes bf16 --seq 2048
