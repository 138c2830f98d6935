"""Split-K for contractions whose output tiles are too few to fill the GPU
(tcc/passes/autoschedule_cuda/split_k.py): the scheduled loop IR against the reference through the
CPU simulator (tests/gpu_sim.py) at small sizes, NVRTC at every size without a GPU (CI), and the
same sizes on a GPU where there is one."""

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccError
from tcc.ir.expr import Const
from tcc.ir.loops import Allocate, For, walk_stmts
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

SOURCE = """
op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j])
}
op linear(X: f32[M, K], W: f32[N, K], b: f32[N]) -> Y: f32[M, N] {
    Y[i, j] = max(sum[k](X[i, k] * W[j, k]) + b[j], 0.0)
}
op bmm(A: f32[Z, M, K], B: f32[Z, K, N]) -> C: f32[Z, M, N] {
    C[z, i, j] = sum[k](A[z, i, k] * B[z, k, j])
}
"""

# odd and round sizes; M or N of 1 is a matrix-vector product (not a contraction tile: checked
# all the same); ragged chunks (K not a multiple of the chunk) and chunks that divide K
CASES = [("mm", dict(M=m, N=n, K=k)) for m, n in ((7, 7), (33, 64), (64, 33), (1, 7), (64, 64))
         for k in (1000, 4099, 20000)]
CASES += [("linear", dict(M=33, N=7, K=4099)), ("linear", dict(M=64, N=64, K=20000)),
          ("linear", dict(M=7, N=33, K=1000)), ("bmm", dict(Z=3, M=33, N=7, K=4099)),
          ("bmm", dict(Z=2, M=64, N=64, K=20000)), ("mm", dict(M=128, N=128, K=65536))]
# small enough for the simulator (a k-step of one block is a quarter of a second there): ragged
# chunks, and chunks that divide K (no guard on the reduction)
SIMULATED = [("mm", dict(M=7, N=7, K=1000)), ("mm", dict(M=7, N=7, K=256)), ("linear", dict(M=33, N=7, K=300)),
             ("bmm", dict(Z=2, M=7, N=9, K=260))]


@pytest.fixture(scope="module")
def lib():
    return tcc.compile(SOURCE, target="cuda")


def _kernels(op, sizes) -> list[For]:
    func = op.lowered(sizes).scheduled
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "block.x"]


def _partials(op, sizes) -> list:
    func = op.lowered(sizes).scheduled
    return [s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.name.startswith("partial")]


def test_few_tiles_and_a_long_reduction_fill_the_chip(lib):
    sizes = dict(M=128, N=128, K=65536)  # one 128 x 128 tile: 128 chunks of 512, one block per SM
    tiles, *combine = _kernels(lib.mm, sizes)
    assert tiles.extent == Const(128, tiles.extent.dtype) and len(combine) == 2  # (aligned and plain)
    assert [p.shape for p in _partials(lib.mm, sizes)] == [(128, 128, 128)]


def test_split_k_never_starts_a_second_wave(lib):
    """Five 64 x 128 tiles on 132 multiprocessors, two blocks each: at most 264 blocks (265 would
    leave one block for a second wave), and no fewer than whole chunks of five allow."""
    sizes = dict(M=64, N=576, K=25088)  # a 3x3 64->64 convolution's weight gradient at batch 8
    tiles, *_ = _kernels(lib.mm, sizes)
    assert 2 * 132 - 2 * 5 <= int(tiles.extent.value) <= 2 * 132
    text = lib.mm.stage_text(sizes, "scheduled")
    assert "partial[chunk, i, j] = acct[" in text and "C[i, j] = acc" in text


def test_full_grids_and_short_reductions_keep_one_kernel(lib):
    for sizes in (dict(M=2048, N=2048, K=65536), dict(M=64, N=64, K=200)):
        assert len(_kernels(lib.mm, sizes)) == 1 and not _partials(lib.mm, sizes)


@pytest.mark.parametrize("name,case", SIMULATED, ids=[f"{n}-{'x'.join(map(str, c.values()))}" for n, c in SIMULATED])
def test_split_k_matches_the_reference_simulated(lib, name, case, rng):
    op = lib[name]
    assert _partials(op, case), "the case must take the split"
    args = random_args(op.te, case, rng)
    (expected,) = reference_results(op.te, args, case)
    out = np.full(expected.shape, np.nan, np.float32)
    names = [p for p in op.te.params if p in op.te.tensors] + list(op.te.results)
    gpu_sim.run(op.lowered(case).scheduled, dict(zip(names, [*args, out])))
    assert_matches(out, expected, op.te.tensors[op.te.results[0]].dtype, name)


@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{'x'.join(map(str, c.values()))}" for n, c in CASES])
def test_split_k_compiles_to_cubin(lib, name, case):
    assert lib[name].stage_text(case, "ptx").count(".entry") >= 1


@pytest.mark.cuda
@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{'x'.join(map(str, c.values()))}" for n, c in CASES])
def test_split_k_matches_reference(lib, name, case, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    op = lib[name]
    args = random_args(op.te, case, rng)
    (expected,) = reference_results(op.te, args, case)
    out = np.full(expected.shape, np.nan, expected.dtype)
    got = op(*args, out=out)
    assert got is out
    assert_matches(out, expected, op.te.tensors[op.te.results[0]].dtype, name)
