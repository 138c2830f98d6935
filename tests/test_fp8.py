"""The 8-bit floats f8e4m3 and f8e5m2: the language (parsing, promotion, errors where a target has
none), the reference's saturating round-to-nearest-even against torch's float8 casts, the CUDA C
of conversions compiled by NVRTC (no GPU needed), and the conversions on the GPU (skipped without)."""

from __future__ import annotations

import numpy as np
import pytest

import tcc
from tcc import dtypes
from tcc.errors import TccError, TccTypeError
from tcc.ir.expr import Const, cast
from tcc.ir.loops import Mma, WarpgroupMma, walk_stmts
from tcc.target import CudaTarget
from tcc.testing import reference_results

torch = pytest.importorskip("torch")

CASTS = """
op narrow(X: f32[N], Z: f64[N]) -> (Y: f8e4m3[N], W: f8e5m2[N]) {
    Y[i] = f8e4m3(X[i])
    W[i] = f8e5m2(Z[i])
}
op widen(Y: f8e4m3[N], W: f8e5m2[N]) -> V: f32[N] {
    V[i] = f32(Y[i]) * 2.0 + f32(W[i])
}
op arith(Y: f8e4m3[N], s: f8e4m3) -> R: f8e4m3[N] {
    R[i] = Y[i] * s + 1.0
}
"""
TORCH = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}
EDGES = [0.0, -0.0, 448.0, 464.0, 465.0, -500.0, 57344.0, 61439.0, 61440.0, 1e9, -1e9, np.inf, -np.inf, np.nan,
         2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-16, 2.0**-17, 1.0625, 1.1875, 0.3]


def _torch_round(x: np.ndarray, dtype: dtypes.DType) -> np.ndarray:
    """torch's float8 cast of ``x``, clamped to the finite range first (torch's e5m2 cast does not
    saturate: 1e9 becomes inf)."""
    largest = dtypes.FP8_FORMATS[dtype.name].largest
    return torch.from_numpy(np.clip(x, -largest, largest)).to(TORCH[dtype.name]).float().numpy()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all((a == b) & (np.signbit(a) == np.signbit(b)) | (np.isnan(a) & np.isnan(b))))


def _samples(rng: np.random.Generator) -> np.ndarray:
    """Normal values over many scales (subnormals to beyond the range), plus the edge cases."""
    scales = np.exp2(rng.integers(-22, 20, 20000)).astype(np.float32)
    return np.concatenate([rng.standard_normal(20000).astype(np.float32) * scales, np.float32(EDGES)])


# ---------------------------------------------------------------- the language

def test_fp8_types_parse_and_promote():
    lib = tcc.compile(CASTS, target="cuda", arch="sm_90")
    assert lib.narrow.te.tensors["Y"].dtype == dtypes.f8e4m3 and lib.narrow.te.tensors["W"].dtype == dtypes.f8e5m2
    assert lib.arith.te.tensors["R"].dtype == dtypes.f8e4m3  # f8 * f8 + literal stays f8
    assert dtypes.promote(dtypes.f8e4m3, dtypes.f8e5m2) == dtypes.f16
    assert dtypes.promote(dtypes.f8e4m3, dtypes.f32) == dtypes.f32
    assert dtypes.promote(dtypes.f8e5m2, dtypes.bf16) == dtypes.bf16
    assert dtypes.promote(dtypes.f8e4m3, dtypes.boolean) == dtypes.f8e4m3
    assert dtypes.promote(dtypes.i32, dtypes.f8e4m3) == dtypes.promote(dtypes.i32, dtypes.f16)


def test_a_reduction_over_fp8_accumulates_in_f32():
    src = "op s(A: f8e4m3[N]) -> Y: f32[1] { Y[z] = sum[k](A[k] * A[k]) }"
    reduce = tcc.compile(src, target="cuda").s.te.computes[0].body
    assert "acc_dtype=f32" in repr(reduce)


@pytest.mark.parametrize("target", ["cpu", CudaTarget.for_arch("sm_80"), CudaTarget.for_arch("sm_86")])
def test_fp8_is_refused_where_there_are_no_fp8_tensor_cores(target):
    with pytest.raises(TccTypeError, match="needs FP8 tensor cores") as err:
        tcc.compile(CASTS, target=target)
    assert ":2:37:" in str(err.value) and "^" in str(err.value)  # the declaration of Y, with a caret
    assert "compute capability 8.9" in str(err.value.hint)


def test_a_conversion_alone_is_refused_on_the_cpu_too():
    with pytest.raises(TccTypeError, match=r"conversion f8e5m2\(\.\.\.\) needs FP8") as err:
        tcc.compile("op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = f32(f8e5m2(X[i]))\n}")
    assert ":2:" in str(err.value)


def test_fp8_targets_by_compute_capability():
    assert [CudaTarget.for_arch(a).fp8 for a in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100")] == \
        [False, False, True, True, True, True]


def test_bad_fp8_spellings_are_errors():
    with pytest.raises(TccError, match="f8e4m3"):  # a suggestion for a near miss
        tcc.compile("op f(X: f8e4m4[N]) -> Y: f32[N] { Y[i] = f32(X[i]) }", target="cuda")
    with pytest.raises(TccError, match="argument"):
        tcc.compile("op f(X: f32[N]) -> Y: f8e4m3[N] { Y[i] = f8e4m3(X[i], X[i]) }", target="cuda")


# ---------------------------------------------------------------- rounding

@pytest.mark.parametrize("name", ["f8e4m3", "f8e5m2"])
def test_round_fp8_matches_torch_with_saturation(name, rng):
    dtype = dtypes.ALL[name]
    x = _samples(rng)
    got = dtypes.round_fp8(x, dtype)
    assert _same(got, _torch_round(x, dtype))
    largest = dtypes.FP8_FORMATS[name].largest
    assert np.nanmax(got) == largest and np.nanmin(got) == -largest and np.isnan(got).sum() == 1  # saturated
    assert _same(dtypes.fp8_values(dtype), torch.arange(256, dtype=torch.uint8).view(TORCH[name]).float().numpy())


def test_the_reference_rounds_casts_and_stores_like_torch(rng):
    op = tcc.compile(CASTS, target="cuda").narrow.te
    x = _samples(rng)
    z = x.astype(np.float64) * 3.0 + 2.0**-40  # off the f32 grid: f64 must round once, not through f32
    y, w = reference_results(op, [x, z], {"N": len(x)})
    assert _same(y, _torch_round(x, dtypes.f8e4m3))
    assert _same(w, dtypes.round_fp8(z, dtypes.f8e5m2))


def test_constants_fold_with_saturation():
    assert cast(Const(1e6, dtypes.f64), dtypes.f8e4m3).value == 448.0
    assert cast(Const(-1e6, dtypes.f64), dtypes.f8e5m2).value == -57344.0
    assert cast(Const(0.3, dtypes.f64), dtypes.f8e4m3).value == 0.3125


# ---------------------------------------------------------------- CUDA C (NVRTC, no GPU)

@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_conversion_kernels_compile(arch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from tcc.codegen_cuda import cuda_c, nvrtc

    lib = tcc.compile(CASTS, target="cuda", arch=arch)
    for op, n in ((lib.narrow, 1000), (lib.widen, 1 << 16), (lib.arith, 1 << 16)):  # (vectorised above 1024)
        code = cuda_c.generate(op.lowered({"N": n}).scheduled, op.target).source
        assert "cvt.rn.satfinite.e4m3x2.f32" in code and "#include" not in code
        assert nvrtc.compile_cubin(code, arch).startswith(b"\x7fELF")
    plain = tcc.compile("op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] }", target="cuda").f
    assert "e4m3" not in cuda_c.generate(plain.lowered({"N": 5}).scheduled, plain.target).source


# ---------------------------------------------------------------- on the GPU

@pytest.fixture(scope="module")
def fp8_gpu():
    try:
        if not tcc.cuda.is_available() or not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores (compute capability below 8.9)")


@pytest.mark.parametrize("n", [1, 7, 33, 1000, 4096])
def test_conversions_on_the_gpu_match_the_reference_exactly(fp8_gpu, rng, n):
    lib = tcc.compile(CASTS, target="cuda")
    x = rng.permutation(_samples(rng))[:n]
    z = x.astype(np.float64) * 3.0 + 2.0**-40
    y, w = lib.narrow(torch.from_numpy(x).cuda(), torch.from_numpy(z).cuda())
    assert y.dtype == torch.float8_e4m3fn and w.dtype == torch.float8_e5m2
    want_y, want_w = reference_results(lib.narrow.te, [x, z], {"N": n})
    assert _same(y.float().cpu().numpy(), want_y) and _same(w.float().cpu().numpy(), want_w)
    v = lib.widen(y, w)
    yy, ww = (t.float().cpu().numpy() for t in (y, w))
    assert _same(v.cpu().numpy(), reference_results(lib.widen.te, [yy, ww], {"N": n})[0])


@pytest.mark.parametrize("n", [1, 33, 1000])
def test_fp8_arithmetic_rounds_each_operation(fp8_gpu, rng, n):
    lib = tcc.compile(CASTS, target="cuda")
    y = torch.from_numpy(dtypes.round_fp8(rng.standard_normal(n) * 8, dtypes.f8e4m3).astype(np.float32))
    out = lib.arith(y.cuda().to(torch.float8_e4m3fn), 1.5).float().cpu().numpy()
    step = dtypes.round_fp8(y.numpy().astype(np.float64) * 1.5, dtypes.f8e4m3)  # CUDA rounds each operation
    assert _same(out, dtypes.round_fp8(step + 1.0, dtypes.f8e4m3))


# ---------------------------------------------------------------- the scaled FP8 GEMM

GEMMS = """
op sgemm(A: f8e4m3[M, K], B: f8e4m3[N, K], sa: f32, sb: f32) -> C: f16[M, N] {
    C[i, j] = f16(sa * sb * sum[k](f32(A[i, k]) * f32(B[j, k])))
}
op bgemm(A: f8e5m2[M, K], B: f8e5m2[N, K], SA: f32[1], SB: f32[1]) -> C: bf16[M, N] {
    C[i, j] = bf16(SA[0] * SB[0] * sum[k](f32(A[i, k]) * f32(B[j, k])))
}
op tgemm(A: f8e4m3[M, K], B: f8e4m3[K, N], SA: f32[1], sb: f32) -> C: f32[M, N] {
    C[i, j] = SA[0] * sb * sum[k](f32(A[i, k]) * f32(B[k, j]))
}
op qgemm(A: f8e4m3[M, K], B: f8e4m3[N, K], sa: f32) -> C: f8e4m3[M, N] {
    C[i, j] = f8e4m3(sa * sum[k](f32(A[i, k]) * f32(B[j, k])))
}
"""
# one rounding of the result (f32: of the sum), relative to the largest
OUT_BOUND = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 1e-5, "f8e4m3": 2.0**-4}


def _gemm_args(op, sizes: dict, rng: np.random.Generator) -> list:
    """Operands rounded to their 8-bit type (normal values times 4: subnormals to tens, and sums
    of 2048 products far from f16's overflow), and scales (scalars or 1-element tensors) that are
    not powers of two."""
    args = []
    for name in op.te.params:
        if name in op.te.scalars:
            args.append(0.37 if name == "sa" else 1.9)
        elif op.te.tensors[name].dtype.is_fp8:
            shape = tuple(sizes[str(d.name)] for d in op.te.tensors[name].shape)
            args.append(dtypes.round_fp8(rng.standard_normal(shape) * 4, op.te.tensors[name].dtype).astype(np.float32))
        else:
            args.append(np.float32([0.37 if name == "SA" else 1.9]))
    return args


def _max_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("arch,name,sizes,instruction", [
    ("sm_90", "sgemm", dict(M=1000, N=1000, K=1024), "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"),
    ("sm_90", "sgemm", dict(M=1000, N=1000, K=1000), "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("sm_90", "bgemm", dict(M=8192, N=8192, K=8192), "wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e5m2"),
    ("sm_90", "tgemm", dict(M=256, N=256, K=256), "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"),
    ("sm_90", "tgemm", dict(M=256, N=256, K=200), "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("sm_89", "sgemm", dict(M=1024, N=1024, K=1024), "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ("sm_89", "bgemm", dict(M=33, N=7, K=1000), "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32"),
])
def test_fp8_gemm_kernels_compile(arch, name, sizes, instruction):
    """The scaled GEMM on the matrix units: wgmma on sm_90 (both operands K-major: a B[k, n] is
    transposed first), mma.sync m16n8k32 on sm_89 and where rows are not whole 16-byte pieces;
    each a cubin with nothing spilled."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from tcc.runtime import cuda as rt

    op = tcc.compile(GEMMS, target="cuda", arch=arch)[name]
    ptx = op.stage_text(sizes, "ptx")
    assert instruction in ptx and "ld.local" not in ptx and "st.local" not in ptx
    assert rt._parse(rt.build(op.lowered(sizes).scheduled, op.target))[1][0].startswith(b"\x7fELF")


@pytest.mark.parametrize("arch,name,sizes,aligned,unit", [
    ("sm_90", "sgemm", dict(M=128, N=128, K=256), True, WarpgroupMma),  # wgmma from swizzled tiles
    ("sm_90", "tgemm", dict(M=128, N=136, K=64), True, WarpgroupMma),  # B[k, n] transposed, then wgmma
    ("sm_89", "sgemm", dict(M=33, N=40, K=64), True, Mma),  # mma.sync on cp.async copies
    ("sm_89", "tgemm", dict(M=33, N=48, K=80), True, Mma),  # B[k, n] transposed, then the copies
    ("sm_89", "bgemm", dict(M=7, N=33, K=70), False, Mma),  # mma.sync on register-staged tiles, odd sizes
    ("sm_90", "tgemm", dict(M=17, N=9, K=40), True, Mma),  # rows not 16-byte pieces: staged K-major
    ("sm_90", "qgemm", dict(M=128, N=128, K=128), True, WarpgroupMma),  # an 8-bit result, saturated
])
def test_fp8_gemm_kernels_in_the_simulator(arch, name, sizes, aligned, unit, rng):
    """The scheduled kernels run by the loop-IR simulator (fragments laid out as PTX specifies for
    m16n8k32), outputs poisoned, against the reference."""
    import gpu_sim

    op = tcc.compile(GEMMS, target="cuda", arch=arch)[name]
    assert any(isinstance(s, unit) for s in walk_stmts(op.lowered(sizes).scheduled.body))
    args = _gemm_args(op, sizes, rng)
    want = reference_results(op.te, args, sizes)[0]
    out = np.full(want.shape, np.nan, np.float16 if name == "sgemm" else np.float32)
    tensors = {n: a for n, a in zip(op.te.params, args) if n in op.te.tensors}
    scalars = {n: a for n, a in zip(op.te.params, args) if n in op.te.scalars}
    gpu_sim.run(op.lowered(sizes).scheduled, {**tensors, "C": out}, aligned=aligned, scalars=scalars)
    assert _max_error(out, want) <= OUT_BOUND[op.te.tensors["C"].dtype.name]


# on an H100: the flat kernel (1 x 1), the register-staged mma.sync kernel (K not a multiple of 16),
# mma.sync on cp.async copies (M < 128), wgmma with and without edges
GPU_SIZES = [dict(M=1, N=1, K=1), dict(M=7, N=7, K=7), dict(M=33, N=33, K=33), dict(M=1000, N=1000, K=1000),
             dict(M=7, N=1000, K=33), dict(M=64, N=1000, K=1024), dict(M=1000, N=1000, K=1024),
             dict(M=256, N=256, K=256), dict(M=1024, N=512, K=2048)]


@pytest.mark.parametrize("name", ["sgemm", "bgemm", "tgemm"])
@pytest.mark.parametrize("sizes", GPU_SIZES, ids=[f"{s['M']}x{s['N']}x{s['K']}" for s in GPU_SIZES])
def test_fp8_gemms_on_the_gpu_match_the_reference(fp8_gpu, name, sizes, rng):
    op = tcc.compile(GEMMS, target="cuda")[name]
    args = _gemm_args(op, sizes, rng)
    want = reference_results(op.te, args, sizes)[0]
    fp8 = TORCH[op.te.tensors["A"].dtype.name]
    device = [torch.from_numpy(a).cuda().to(fp8) if op.te.tensors.get(n) is not None and op.te.tensors[n].dtype.is_fp8
              else torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a
              for n, a in zip(op.te.params, args)]
    out_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[op.te.tensors["C"].dtype.name]
    out = torch.full(want.shape, float("nan"), dtype=out_dtype, device="cuda")
    op(*device, out=out)
    assert _max_error(out.float().cpu().numpy(), want) <= OUT_BOUND[op.te.tensors["C"].dtype.name]


@pytest.mark.parametrize("n", [256, 1024])
def test_fp8_gemm_agrees_with_torch_scaled_mm(fp8_gpu, n, rng):
    """The same product as PyTorch's FP8 GEMM (per-tensor scales, f16 out)."""
    op = tcc.compile(GEMMS, target="cuda").sgemm
    a = torch.from_numpy(dtypes.round_fp8(rng.standard_normal((n, n)) * 4, dtypes.f8e4m3).astype(np.float32))
    b = torch.from_numpy(dtypes.round_fp8(rng.standard_normal((n, n)) * 4, dtypes.f8e4m3).astype(np.float32))
    a8, b8 = a.cuda().to(torch.float8_e4m3fn), b.cuda().to(torch.float8_e4m3fn)
    sa, sb = torch.tensor(0.37, device="cuda"), torch.tensor(1.9, device="cuda")
    want = torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)
    want = want[0] if isinstance(want, tuple) else want  # (PyTorch before 2.4: (out, amax))
    got = op(a8, b8, 0.37, 1.9)
    assert _max_error(got.float().cpu().numpy(), want.float().cpu().numpy()) <= 2.0**-9


def test_fp8_ops_through_tcc_torch(fp8_gpu, rng):
    """tcc.torch registers the op; float8 tensors go in, a float16 tensor comes out."""
    import tcc.torch

    ops = tcc.torch.library(GEMMS, namespace="tcc_fp8_test", target="cuda")
    sizes = dict(M=130, N=136, K=96)
    args = _gemm_args(tcc.compile(GEMMS, target="cuda").sgemm, sizes, rng)
    a8, b8 = (torch.from_numpy(x).cuda().to(torch.float8_e4m3fn) for x in args[:2])
    got = ops.sgemm(a8, b8, *args[2:])
    assert got.dtype == torch.float16 and got.is_cuda
    want = reference_results(tcc.compile(GEMMS, target="cuda").sgemm.te, args, sizes)[0]
    assert _max_error(got.float().cpu().numpy(), want) <= OUT_BOUND["f16"]


@pytest.mark.parametrize("name", ["f8e4m3", "f8e5m2"])
def test_fp8_bytes_are_torch_storage(name, rng):
    """dtypes.fp8_bytes (what tcc.cuda.to_device(x, dtype=...) uploads) is the storage of torch's
    float8 tensor of the saturated values, and reads back through fp8_values."""
    dtype = dtypes.ALL[name]
    x = _samples(rng)
    got = dtypes.fp8_bytes(x, dtype)
    largest = dtypes.FP8_FORMATS[name].largest
    want = torch.from_numpy(np.clip(x, -largest, largest)).to(TORCH[name]).view(torch.uint8).numpy()
    finite = ~np.isnan(x)
    assert np.array_equal(got[finite], want[finite]) and np.isnan(dtypes.fp8_values(dtype)[got[~finite]]).all()
    assert _same(dtypes.fp8_values(dtype)[got], dtypes.round_fp8(x, dtype))


def test_fp8_arrays_upload_and_read_back(fp8_gpu, rng):
    x = _samples(rng)
    arr = tcc.cuda.to_device(x, dtype="f8e4m3")
    assert arr.dtype == dtypes.f8e4m3 and _same(arr.to_numpy(), dtypes.round_fp8(x, dtypes.f8e4m3))
    lib = tcc.compile(CASTS, target="cuda")
    out = lib.widen(arr, tcc.cuda.to_device(x, dtype="f8e5m2"))
    y, w = dtypes.round_fp8(x, dtypes.f8e4m3), dtypes.round_fp8(x, dtypes.f8e5m2)
    assert isinstance(out, tcc.cuda.Array)
    assert _same(out.to_numpy(), reference_results(lib.widen.te, [y, w], {"N": len(x)})[0])
