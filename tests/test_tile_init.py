"""GEMM register tiles start at zero: no init nest zeroes C first. A reduction that fits one k
block never loads C; a longer one loads what the block before stored from the second block on
(and a k tail always does)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op

import tcc

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
EPILOGUE = ("op mm_relu(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C: f32[M, N] "
            "{ C[i, j] = max(sum[k](A[i, k] * B[k, j]) + b[j], 0.0) }")


def _text(src: str, name: str, m: int, k: int, n: int) -> str:
    op = tcc.compile(src)[name]
    args = [np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)]
    return op.lower(*args, *([np.zeros(n, np.float32)] if name == "mm_relu" else []), stage="scheduled")


@pytest.mark.parametrize("m, k, n", [(37, 29, 45), (131, 256, 70), (61, 257, 99), (40, 1100, 33), (17, 1301, 40)])
def test_tiles_start_at_zero(m, k, n, rng):
    text = _text(MATMUL, "matmul", m, k, n)
    # kc of the 2-core test host model is 256 (L1 32 KiB / 32 lanes / 4 bytes); up to 4 blocks run as one
    one_block = k <= 1024
    assert "_init" not in text
    assert "C_c1[ii, jj] = f32(0.0)" in text
    assert ("if ko == 0:" in text) != one_block
    assert ("C_c1[ii, jj] = C[" in text) != one_block
    check_op(MATMUL, "matmul", {"M": m, "K": k, "N": n}, rng)


@pytest.mark.parametrize("m, k, n", [(37, 29, 45), (61, 300, 99), (13, 1100, 40)])
def test_epilogue_accumulator_starts_at_zero(m, k, n, rng):
    text = _text(EPILOGUE, "mm_relu", m, k, n)
    one_block = k <= 1024
    assert "C_acc_c1[ii, jj] = f32(0.0)" in text
    # one k block: the epilogue is applied as each register tile is stored (no C_acc, no second nest)
    assert ("allocate C_acc:" not in text) == one_block
    # (several k blocks of one size, 1100 = 5 x 220: the last block's tile stores apply it too)
    assert "= max(C_acc_c1[ii, jj] + b[" in text
    check_op(EPILOGUE, "mm_relu", {"M": m, "K": k, "N": n}, rng)
