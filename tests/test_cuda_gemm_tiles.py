"""The f32 tiled GEMM's register tiles (tcc/passes/autoschedule_cuda/gemm.py): runs of 4 rows and columns
read from shared memory 16 bytes at a time; the largest tiles at odd sizes on the GPU."""

import numpy as np
import pytest

import tcc
from tcc.errors import TccError
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

MATMUL = "op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
# 128 x 128 tiles (a grid of >= 132 of them) with ragged edges, 64 x 64 tiles, 32 x 32 tiles (TM = 2)
CASES = [dict(M=1537, K=33, N=1543), dict(M=1000, K=7, N=1000), dict(M=33, K=65, N=31), dict(M=1, K=1000, N=2)]


def test_register_runs_are_16_byte_shared_loads():
    op = tcc.compile(MATMUL, target="cuda").mm
    ptx = op.stage_text(dict(M=4096, K=4096, N=4096), "ptx")
    assert ptx.count("ld.shared.v4.f32") == 64 and "ld.shared.f32" not in ptx  # 16 k-steps x (2 + 2) runs
    assert ".entry" in op.stage_text(CASES[2], "ptx")


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c.values())) for c in CASES])
def test_tiles_match_reference(case, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    op = tcc.compile(MATMUL, target="cuda").mm
    args = random_args(op.te, case, rng)
    (expected,) = reference_results(op.te, args, case)
    out = np.full(expected.shape, np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, expected, op.te.tensors["C"].dtype)
