#!/bin/sh
# The device check of tcc.grad of 16-bit attention on FlashAttention-2's backward template (issue 26,
# item 3): its GPU tests, then the f16 backward rows of benchmarks/attention.py against SDPA's backward
# (B4 H16, D 64 and 128, S 2048 and 8192, causal and not). Run from the repository root on a CUDA
# machine; bf16's rows: add `--dtypes bf16` to a second benchmark call.
set -e
export TCC_CACHE_DIR="${TCC_CACHE_DIR:-/tmp/tcc-cache-flash-bwd}"
PY="${PYTHON:-python}"
"$PY" -m pytest -q -rfE tests/test_attention_grad_gpu.py -k half
"$PY" benchmarks/attention.py --device cuda --no-forward --trials 3 --dtypes f16 --seq 2048 8192
