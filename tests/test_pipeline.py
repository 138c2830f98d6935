"""The pipeline reports every pass (``--print-after-all``), on both targets, and the op it
compiles still computes the right answer."""

import numpy as np
import pytest
from helpers import check_op

import tcc
from tcc.passes.trace import UNCHANGED
from tcc.runtime import cpu as cpu_backend
from tcc.runtime import cuda as cuda_backend

MATMUL_RELU = """op mm(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C: f32[M, N] {
    T[i, j] = sum[k](A[i, k] * B[k, j])
    C[i, j] = max(T[i, j] + b[j], 0.0)
}"""
CONV = """op conv(X: f32[N, C, H, W], Wt: f32[F, C, 3, 3]) -> Y: f32[N, F, H - 2, W - 2] {
    Y[n, f, y, x] = sum[c, r, s](X[n, c, y + r, x + s] * Wt[f, c, r, s])
}"""
TE_PASSES = ["specialize", "phases", "scans", "bounds", "sweep pairs", "stream reductions", "matrix sweeps", "inline",
             "im2col", "group", "lower"]


def _passes(op, bindings, stage="scheduled") -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    op.stage_text(bindings, stage, lambda name, text: seen.append((name, text)))
    return seen


def test_every_cpu_pass_and_auto_schedule_step_is_reported(rng):
    sizes = dict(M=67, K=33, N=65)
    check_op(MATMUL_RELU, "mm", sizes, rng)  # the same pipeline computes the right answer
    seen = _passes(tcc.compile(MATMUL_RELU).mm, sizes)
    names = [name for name, _ in seen]
    assert names[:len(TE_PASSES)] == TE_PASSES
    steps = names[len(TE_PASSES):]
    for expected in ("decompose C", "reorder", "vectorize jj", "unroll ii", "contract", "streaming stores"):
        assert any(s.startswith(expected) for s in steps), (expected, steps)
    assert sum(s.startswith("split ") for s in steps) == 7 and sum(s.startswith("cache ") for s in steps) >= 2
    assert dict(seen)["inline"] != UNCHANGED  # T folded into C's epilogue: fusion's decision, reported
    assert dict(seen)["im2col"] == UNCHANGED  # no window in a matmul


def test_im2col_is_its_own_pass(rng):
    sizes = dict(N=2, C=8, H=33, W=31, F=16)
    op = tcc.compile(CONV, conv="im2col").conv
    check_op(CONV, "conv", sizes, rng)
    seen = dict(_passes(op, sizes, "loops"))
    assert seen["im2col"] != UNCHANGED and "Y_gemm" in seen["im2col"]


def test_user_schedule_steps_are_reported_one_by_one(rng):
    src = MATMUL_RELU + "\nschedule mm cpu {\n    split(i, 8, io, ii); vectorize(j)\n}\n"
    sizes = dict(M=17, K=7, N=33)
    check_op(src, "mm", sizes, rng)
    names = [name for name, _ in _passes(tcc.compile(src).mm, sizes)]
    assert names[len(TE_PASSES):] == ["split i by 8 -> io, ii", "vectorize j"], names


def test_cpu_and_cuda_share_stage_names():
    shared = ("ast", "te", "fused", "loops", "scheduled")
    assert cpu_backend.STAGES[:5] == shared and cuda_backend.STAGES[:5] == shared


def test_cuda_pipeline_reports_each_kernel():
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(MATMUL_RELU, target="cuda").mm
    seen = _passes(op, dict(M=67, K=33, N=65))
    names = [name for name, _ in seen]
    assert names[:len(TE_PASSES)] == TE_PASSES and names[len(TE_PASSES):] == ["gemm: C", "merge one-block kernels"]
    assert "# block.x" in seen[-2][1] and seen[-1][1] == "(unchanged)"
    fused = op.lower(np.ones((67, 33), np.float32), np.ones((33, 65), np.float32), np.ones(65, np.float32),
                     stage="fused")
    assert "inline T" in fused
