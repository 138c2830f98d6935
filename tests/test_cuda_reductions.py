"""Reductions with few outputs split across blocks (tcc/passes/autoschedule_cuda/split_reduction.py): the
schedule's shape and NVRTC without a GPU (CI), and agreement with the reference on the GPU."""

import numpy as np
import pytest

import tcc
from tcc.errors import TccError
from tcc.ir.loops import For, walk_stmts
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

SOURCE = """
op total(X: f32[M, N]) -> Y: f32[1] {
    Y[z] = sum[i, j](X[i, j])
}
op mean(X: f32[M, N]) -> Y: f32[1] {
    Y[z] = sum[i, j](X[i, j]) / f32(M * N)
}
op top(X: f32[M, N]) -> Y: f32[2] {
    Y[z] = max[i, j](X[i, j]) + f32(z)
}
op chansum(X: f32[N, C, H, W]) -> Y: f32[C] {
    Y[c] = sum[n, h, w](X[n, c, h, w])
}
op hsum(X: f16[M, N]) -> Y: f16[1] {
    Y[z] = sum[i, j](X[i, j])
}
op isum(X: i32[M, N]) -> Y: i64[1] {
    Y[z] = sum[i, j](i64(X[i, j]))
}
op nested(X: f32[K, M]) -> Y: f32[M] {
    Y[i] = sum[k1: K](max[k2: K](X[k2, i] * f32(k1 - k2)))
}
"""

# (op, bindings): odd and round sizes; the large ones take the split (rows, flat index and short
# trailing axes alike), the small ones the one-block row schedule
CASES = [("total", dict(M=1, N=1)), ("total", dict(M=7, N=33)), ("total", dict(M=33, N=7)),
         ("total", dict(M=1000, N=1000)), ("total", dict(M=33, N=7001)), ("total", dict(M=7001, N=33)),
         ("total", dict(M=3, N=65536)), ("mean", dict(M=1000, N=1000)), ("mean", dict(M=7, N=1)),
         ("top", dict(M=1000, N=1000)), ("top", dict(M=33, N=33)), ("chansum", dict(N=7, C=3, H=33, W=33)),
         ("chansum", dict(N=32, C=5, H=64, W=64)), ("chansum", dict(N=2, C=3, H=1000, W=7)),
         ("chansum", dict(N=1, C=1, H=1, W=1)), ("hsum", dict(M=1000, N=33)), ("isum", dict(M=1000, N=1000)),
         ("nested", dict(K=100, M=7)), ("nested", dict(K=64, M=1))]  # a reduction inside the row's reduction


@pytest.fixture(scope="module")
def lib():
    return tcc.compile(SOURCE, target="cuda")


def _block_loops(op, bindings) -> list[For]:
    func = op.lowered(bindings).scheduled
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "block.x"]


def test_a_full_reduction_fills_the_chip(lib):
    first, second = _block_loops(lib.total, dict(M=8192, N=8192))
    assert first.extent.value >= 132 * 4 and second.extent.value == 1
    src = lib.total.stage_text(dict(M=8192, N=8192), "cuda")
    assert src.count("__global__") == 2 and src.count("tcc_block_allreduce(") == 3  # 2 uses + preamble


def test_a_reduction_over_an_inner_reduction_combines_across_the_block(lib):
    text = lib.nested.stage_text(dict(K=100, M=7), "scheduled")  # a fuzzer find: it raced
    assert "allreduce=" in text


def test_many_outputs_keep_one_block_each(lib):
    (kernel,) = _block_loops(lib.chansum, dict(N=2, C=1024, H=32, W=32))
    assert kernel.extent.value == 1024
    assert len(_block_loops(lib.total, dict(M=7, N=33))) == 1  # too short to split


@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{'x'.join(map(str, c.values()))}" for n, c in CASES])
def test_split_reductions_compile_to_cubin(lib, name, case):
    assert lib[name].stage_text(case, "ptx").count(".entry") >= 1


@pytest.mark.cuda
@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{'x'.join(map(str, c.values()))}" for n, c in CASES])
def test_split_reductions_match_reference(lib, name, case, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    op = lib[name]
    args = random_args(op.te, case, rng)
    (expected,) = reference_results(op.te, args, case)
    out = np.full(expected.shape, np.nan if expected.dtype.kind == "f" else -77, expected.dtype)
    got = op(*args, out=out)
    assert got is out
    assert_matches(out, expected, op.te.tensors[op.te.results[0]].dtype, name)
