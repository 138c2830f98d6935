"""Tensor cores from the loop IR: tensorize's checks and the generated programs (no GPU needed),
then wgmma / mma.sync / TF32 kernels against references on the GPU (skipped without one)."""

from pathlib import Path

import numpy as np
import pytest

import tcc
from tcc import dtypes
from tcc.errors import TccArgumentError, TccError, TccScheduleError
from tcc.ir.expr import Binary, Cast, Const, Load, Var
from tcc.ir.loops import Allocate, Buffer, For, LoopFunc, Store, format_func
from tcc.passes.loops.tensorize import tensorize
from tcc.testing import assert_matches, random_args, reference_results

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
I64, F32, F16 = dtypes.i64, dtypes.f32, dtypes.f16
HMM = "op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }"
BHMM = "op bhmm(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }"
HLIN = "op hlin(A: f16[M, K], W: f16[N, K]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(W[j, k])) }"
HBMM = """op hbmm(A: f16[B, M, K], X: f16[B, K, N], s: f16[N]) -> C: f16[B, M, N] {
    C[b, i, j] = f16(max(sum[k](f32(A[b, i, k]) * f32(X[b, k, j])) + f32(s[j]), 0.0))
}"""


# ---------------------------------------------------------------- tensorize (no GPU)

def _tile(tm: int, tn: int, tk: int, what: str = "mma.sync", acc_index=None) -> For:
    """The marked nest ``C[i, j] += f32(X[i, k]) * f32(Y[j, k])`` over shared X, Y."""
    i, j, k, lane = Var("i"), Var("j"), Var("k"), Var("lane")
    x = Cast(Load("X", (i, k), F16), F32)
    y = Cast(Load("Y", (j, k), F16), F32)
    where = acc_index or (i, j)
    acc = Load("C", where, F32)
    update = Store("C", where, Binary("add", acc, Binary("mul", x, y, F32), F32))
    return For(i, Const(tm, I64), For(j, Const(tn, I64), For(k, Const(tk, I64), update)),
               annotations=(("tensorize", what), ("lane", lane)))


def _kernel(nest: For, tm: int, tn: int, tk: int) -> For:
    body = Allocate(Buffer("X", F16, (tm, tk + 8), "shared"), Allocate(Buffer("Y", F16, (tn, tk + 8), "shared"),
                    Allocate(Buffer("C", F32, (tm, tn), "local"), nest)))
    return For(Var("lane"), Const(32, I64), body, "thread.x")


def _fresh():
    counter = iter(range(10**6))
    return lambda base: Var(f"{base}_{next(counter)}")


def test_tensorize_turns_a_warp_tile_into_fragments_and_mma():
    out = tensorize(_kernel(_tile(32, 16, 32), 32, 16, 32), _fresh())
    text = format_func(LoopFunc("t", [], out))
    assert "allocate C: f32[2, 2, 4] in local" in text  # the lanes' fragments
    assert text.count("mma.sync.m16n8k16.f16") == 1 and text.count("ldmatrix.x4") == 2


@pytest.mark.parametrize("nest,message", [
    (_tile(24, 16, 32), "not made of whole instructions"),
    (_tile(32, 16, 32, "mma.async"), "unknown instruction"),
    (_tile(32, 16, 32, "mma.sync.tf32"), "f32 operands need a mark ending .tf32"),
    (_tile(32, 16, 32, "wgmma"), "m64nNk16"),
    (_tile(32, 16, 32, acc_index=(Var("j"), Var("i"))), "not C\\[i, j\\]"),
])
def test_tensorize_refuses_what_does_not_fit(nest, message):
    with pytest.raises(TccScheduleError, match=message):
        tensorize(_kernel(nest, 32, 16, 32), _fresh())


def test_tf32_is_an_option_of_cuda_only():
    with pytest.raises(TccArgumentError, match="tf32"):
        tcc.compile(HMM, target="cpu", tf32=True)
    with pytest.raises(TccArgumentError, match="tf32="):
        tcc.compile(HMM, target="cuda", tf32="yes")


def test_generated_tensor_core_programs_compile():
    """Each kind of tensor-core kernel compiles to a cubin (sm_90a where it uses wgmma), with
    nothing spilled to local memory."""
    from tcc.runtime import cuda as rt

    tf32 = tcc.compile(EXAMPLES / "matmul.tc", target="cuda", tf32=True).matmul
    cases = [(tcc.compile(BHMM, target="cuda").bhmm, dict(M=1000, K=256, N=136), "wgmma.mma_async"),
             (tcc.compile(HLIN, target="cuda").hlin, dict(M=300, K=72, N=520), "wgmma.mma_async"),
             (tf32, dict(M=130, K=257, N=129), "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
             (tf32, dict(M=4096, K=4096, N=4096), "cp.async.cg.shared.global"),
             (tf32, dict(M=70, K=33, N=129), "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")]
    for op, sizes, instruction in cases:
        ptx = op.stage_text(sizes, "ptx")
        assert instruction in ptx and "ld.local" not in ptx and "st.local" not in ptx
        assert rt._parse(rt.build(op.lowered(sizes).scheduled, op.target))[1][0].startswith(b"\x7fELF")


# ---------------------------------------------------------------- on the GPU

@pytest.fixture(scope="module")
def gpu():
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


HALF_CASES = [(HMM, dict(M=1000, K=1000, N=1000)), (HMM, dict(M=257, K=136, N=384)), (HMM, dict(M=512, K=64, N=256)),
              (HMM, dict(M=128, K=8, N=128)), (HLIN, dict(M=300, K=72, N=520)), (HLIN, dict(M=256, K=512, N=256)),
              (HBMM, dict(B=3, M=130, K=64, N=136)), (HBMM, dict(B=2, M=7, K=33, N=5))]


@pytest.mark.cuda
@pytest.mark.parametrize("source,sizes", HALF_CASES, ids=[f"{s.split('(')[0][3:]}-{i}" for i, (s, _) in
                                                          enumerate(HALF_CASES)])
def test_half_gemms_match_reference(gpu, source, sizes, rng):
    op = next(iter(tcc.compile(source, target="cuda").ops.values()))
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, expected[0].dtype)
    op(*args, out=out)
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, op.name)


@pytest.mark.cuda
@pytest.mark.parametrize("m,k,n", [(1000, 256, 136), (1000, 256, 130), (131, 80, 192), (7, 16, 9)])
def test_bf16_gemms_match_float64(gpu, m, k, n, rng):
    torch = pytest.importorskip("torch")
    op = tcc.compile(BHMM, target="cuda").bhmm
    a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda().bfloat16()
    b = torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32)).cuda().bfloat16()
    out = torch.full((m, n), float("nan"), device="cuda")
    op(a, b, out=out)
    torch.testing.assert_close(out, a.double().matmul(b.double()).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("m,k,n", [(7, 33, 5), (130, 257, 129), (256, 64, 512), (1, 40, 1000), (70, 33, 129),
                                   (1000, 1000, 1000), (130, 36, 129), (1024, 1024, 1024)])
def test_tf32_gemm_within_tf32_rounding(gpu, m, k, n, rng):
    """TF32 rounds each operand to 10 mantissa bits: the relative error of the product is about
    2^-11 per operand, far above f32's but bounded; it must be opted into."""
    op = tcc.compile(EXAMPLES / "matmul.tc", target="cuda", tf32=True).matmul
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    op(a, b, out=out)
    want = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(out - want) / np.linalg.norm(want)
    assert err < 2e-3, err  # tf32: about 3e-4; f16-rounded operands would give more, wrong ones far more


TF32_BMM = """op tbmm(A: f32[B, M, K], X: f32[B, K, N], s: f32[N]) -> C: f32[B, M, N] {
    C[b, i, j] = max(sum[k](A[b, i, k] * X[b, k, j]) + s[j], 0.0)
}"""


@pytest.mark.cuda
@pytest.mark.parametrize("sizes", [dict(B=3, M=257, K=100, N=131), dict(B=2, M=7, K=33, N=5)])
def test_tf32_batched_gemm_with_epilogue(gpu, sizes, rng):
    """A batched TF32 GEMM (its [k][n] operand transposed per batch element) with a fused epilogue."""
    op = tcc.compile(TF32_BMM, target="cuda", tf32=True).tbmm
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, np.float32)
    op(*args, out=out)
    err = np.linalg.norm(out - expected[0]) / np.linalg.norm(expected[0])
    assert err < 2e-3, err


@pytest.mark.cuda
def test_cli_checks_tf32_runs_with_a_tf32_bound(gpu, capsys):
    from tcc.cli import main

    code = main(["run", str(EXAMPLES / "matmul.tc"), "-D", "M=130", "-D", "K=257", "-D", "N=129", "--target", "cuda",
                 "--tf32", "--check", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "vs reference: ok" in out, out
