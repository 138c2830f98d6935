"""The CUDA backend on a GPU: every example against the reference, framework tensors in place,
and the error paths (each a TccError, device memory back where it was). Skipped without a GPU."""

import gc
from pathlib import Path

import numpy as np
import pytest
from test_examples import CASES

import tcc
from tcc.errors import TccError, TccRuntimeError
from tcc.testing import assert_matches, random_args, reference_results

pytestmark = pytest.mark.cuda
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BIG = {"softmax": dict(N=256, C=4096), "layernorm": dict(N=512, D=1024), "matmul": dict(M=128, K=256, N=64),
       "axpy": dict(N=1 << 20), "conv2d": dict(N=2, C=8, H=32, W=32, F=16, KH=3, KW=3, P=1)}


@pytest.fixture(scope="module", autouse=True)
def gpu():
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


def _torch():
    return pytest.importorskip("torch")


def _cases():
    for name, cases in CASES.items():
        for i, case in enumerate(cases):
            yield pytest.param(name, case, id=f"{name}-{i}")
    for name, case in BIG.items():
        yield pytest.param(name, case, id=f"{name}-big")


def _poisoned(expected):
    return [np.full(e.shape, np.nan if e.dtype.kind == "f" else -77, e.dtype) for e in expected]


@pytest.mark.parametrize("name,case", list(_cases()))
def test_example_matches_reference_numpy(name, case, rng):
    op = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda")[name]
    cparams = {k: v for k, v in case.items() if k in op.te.cparams}
    bindings = {**op.te.cparams, **case}
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    outs = _poisoned(expected)
    got = op(*args, out=outs[0] if len(outs) == 1 else tuple(outs), **cparams)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e, o in zip(op.te.results, got, expected, outs):
        assert g is o and isinstance(g, np.ndarray)
        assert_matches(g, e, op.te.tensors[r].dtype, f"{name}.{r}")


@pytest.mark.parametrize("name,case", list(_cases()))
def test_example_matches_reference_torch(name, case, rng):
    torch = _torch()
    op = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda")[name]
    cparams = {k: v for k, v in case.items() if k in op.te.cparams}
    bindings = {**op.te.cparams, **case}
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    dev = [torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args]
    outs = [torch.from_numpy(o).cuda() for o in _poisoned(expected)]
    ptrs = [o.data_ptr() for o in outs]
    got = op(*dev, out=outs[0] if len(outs) == 1 else tuple(outs), **cparams)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e, o, p in zip(op.te.results, got, expected, outs, ptrs):
        assert g is o and g.data_ptr() == p, "out= is written in place"
        assert_matches(g.cpu().numpy(), e, op.te.tensors[r].dtype, f"{name}.{r}")
    fresh = op(*dev, **cparams)
    fresh = fresh if isinstance(fresh, tuple) else (fresh,)
    for r, g, e in zip(op.te.results, fresh, expected):
        assert isinstance(g, torch.Tensor) and g.is_cuda
        assert_matches(g.cpu().numpy(), e, op.te.tensors[r].dtype, f"{name}.{r} (new tensor)")


def test_torch_inputs_used_in_place_on_the_current_stream(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = lib.axpy(2.0, x, y)
    s.synchronize()
    torch.testing.assert_close(z, 2.0 * x + y)


def test_non_contiguous_torch_input(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "matmul.tc", target="cuda")
    a = torch.randn(33, 17, device="cuda").t()  # a strided view
    b = torch.randn(33, 9, device="cuda")
    c = lib.matmul(a, b)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


def test_non_contiguous_torch_out():
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = torch.randn(10, device="cuda")
    out = torch.zeros(20, device="cuda")[::2]
    lib.axpy(3.0, x, x, out=out)
    torch.testing.assert_close(out, 4.0 * x)


def test_tcc_arrays_and_dlpack_round_trip(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "bias_relu.tc", target="cuda")
    x = tcc.cuda.to_device(rng.standard_normal((7, 33)).astype(np.float32))
    b = tcc.cuda.to_device(rng.standard_normal(33).astype(np.float32))
    y = lib.bias_relu(x, b)
    assert isinstance(y, tcc.cuda.Array) and y.shape == (7, 33) and y.dtype == np.float32
    np.testing.assert_allclose(y.to_numpy(), np.maximum(x.to_numpy() + b.to_numpy(), 0), rtol=1e-6)
    t = torch.from_dlpack(y)
    assert t.data_ptr() == y.ptr and t.device.type == "cuda"
    assert y.__cuda_array_interface__["data"][0] == y.ptr
    del y
    torch.testing.assert_close(t.cpu(), torch.from_numpy(np.maximum(x.to_numpy() + b.to_numpy(), 0)))


def test_cupy_inputs(rng):
    cupy = pytest.importorskip("cupy")
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = cupy.asarray(rng.standard_normal(100).astype(np.float32))
    z = lib.axpy(2.0, x, x)
    assert isinstance(z, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(z), 3.0 * cupy.asnumpy(x), rtol=1e-6)


def test_integer_semantics_on_the_gpu(rng):
    src = """
    op f(A: i32[N], B: i32[N], X: f32[N], Y: f32[N]) -> (Q: i32[N], R: i32[N], M: f32[N], F: f32[N]) {
        Q[i] = A[i] // B[i]
        R[i] = A[i] % B[i]
        M[i] = max(X[i], Y[i])
        F[i] = X[i] % Y[i]
    }
    """
    op = tcc.compile(src, target="cuda").f
    a = rng.integers(-50, 50, 301).astype(np.int32)
    b = rng.integers(-7, 8, 301).astype(np.int32)
    x = rng.standard_normal(301).astype(np.float32)
    y = rng.standard_normal(301).astype(np.float32)
    x[::7] = np.nan
    q, r, m, f = op(a, b, x, y)
    nz = b != 0
    np.testing.assert_array_equal(q[nz], a[nz] // b[nz])
    np.testing.assert_array_equal(r[nz], a[nz] % b[nz])
    assert (q[~nz] == 0).all() and (r[~nz] == 0).all()
    np.testing.assert_array_equal(np.isnan(m), np.isnan(x))
    np.testing.assert_allclose(f, np.mod(x, y), rtol=1e-5, atol=1e-6)


def test_bf16_and_f16_with_torch(rng):
    torch = _torch()
    src = """
    op f(X: bf16[N], H: f16[N]) -> (Y: bf16[N], Z: f16[N]) {
        Y[i] = X[i] * 2.0 + exp(X[i])
        Z[i] = H[i] * H[i] + 1.0
    }
    """
    op = tcc.compile(src, target="cuda").f
    x = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(1000, device="cuda", dtype=torch.float16)
    y, z = op(x, h)
    assert y.dtype == torch.bfloat16 and z.dtype == torch.float16
    torch.testing.assert_close(y.float(), (x.float() * 2 + x.float().exp()), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(z, h * h + 1)


# ---------------------------------------------------------------- errors

def _memory():
    """(tcc's device bytes, PyTorch's): after a collection, so that tensors of earlier tests that
    a garbage cycle kept alive are not freed between two readings (seen under xdist on the H100)."""
    torch = _torch()
    gc.collect()
    torch.cuda.synchronize()
    return tcc.cuda.allocated_bytes(), torch.cuda.memory_allocated()


def test_out_of_memory_names_the_result_and_frees_everything(rng):
    torch = _torch()
    src = """
    op outer(X: f32[N]) -> Y: f32[N, N] {
        Y[i, j] = X[i] * X[j]
    }
    """
    op = tcc.compile(src, target="cuda").outer
    x = torch.randn(600_000, device="cuda")  # Y would be 1.4 TB
    before = _memory()
    # refused before any work: by the size check (larger than the host's memory) or the device
    with pytest.raises(tcc.TccError, match="result Y") as info:
        op(x)
    assert "hint" in str(info.value)
    assert _memory() == before
    torch.testing.assert_close(op(x[:100]), torch.outer(x[:100], x[:100]))


def test_out_of_memory_for_an_intermediate_frees_everything(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "softmax.tc", target="cuda")
    x = torch.randn(7, 2000, device="cuda")
    lib.softmax(x)
    kernel = lib.softmax.kernel({"N": 7, "C": 2000})
    before = _memory()
    kernel.temps.append(("huge", 1 << 45))  # 32 TiB: the allocation fails
    try:
        with pytest.raises(TccRuntimeError, match="op softmax: intermediate huge: cannot allocate"):
            lib.softmax(x)
    finally:
        kernel.temps.pop()
    assert _memory() == before
    torch.testing.assert_close(lib.softmax(x), torch.softmax(x, dim=1))


def test_launch_failure_is_a_tcc_error_and_frees_everything(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "softmax.tc", target="cuda")
    x = torch.randn(7, 2000, device="cuda")
    lib.softmax(x)  # load it
    kernel = lib.softmax.kernel({"N": 7, "C": 2000})
    launcher = kernel.launchers(0)[-1]
    good = launcher.block
    before = _memory()
    launcher.block = 4096  # over the limit of 1024 threads a block: the launch is refused
    try:
        with pytest.raises(TccRuntimeError, match="op softmax: launching kernel tcc_softmax_k"):
            lib.softmax(x)
    finally:
        launcher.block = good
    assert _memory() == before
    torch.testing.assert_close(lib.softmax(x), torch.softmax(x, dim=1))


def test_wrong_device_or_dtype_is_an_argument_error():
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = torch.randn(8, device="cuda")
    with pytest.raises(TccError, match="argument Y of axpy must be f32"):
        lib.axpy(1.0, x, x.double())
    if torch.cuda.device_count() > 1:
        with pytest.raises(TccError, match="cuda:1"):
            lib.axpy(1.0, x, x.to("cuda:1"))
    with pytest.raises(TccError, match="out= for Z"):
        lib.axpy(1.0, x, x, out=torch.empty(9, device="cuda"))


# ---------------------------------------------------------------- the tiled contraction schedule

BMM = """
op bmm(A: f32[B, M, K], X: f32[B, K, N]) -> C: f32[B, M, N] {
    C[b, i, j] = sum[k](A[b, i, k] * X[b, k, j])
}
"""
GEMM_CASES = [("matmul", dict(M=67, K=45, N=33)), ("matmul", dict(M=130, K=257, N=129)),
              ("matmul", dict(M=256, K=64, N=512)), ("matmul", dict(M=1000, K=24, N=1000)),
              ("hmm", dict(M=129, K=70, N=65)), ("conv2d_relu", dict(N=2, C=16, H=15, W=17, F=24, KH=3, KW=3)),
              ("conv2d", dict(N=3, C=5, H=20, W=19, F=70, KH=3, KW=2, S=2, P=1)), ("bmm", dict(B=3, M=19, K=21, N=35))]


HALF_SOURCES = {
    "hbmm": """
op hbmm(A: f16[B, M, K], X: f16[B, K, N]) -> C: f32[B, M, N] {
    C[b, i, j] = max(sum[k](f32(A[b, i, k]) * f32(X[b, k, j])), 0.0)
}
""",
    "hconv": """
op hconv(X: f16[N, C, H, W], Wt: f16[F, C, 3, 3]) -> Y: f32[N, F, H - 2, W - 2] {
    Y[n, f, y, x] = sum[c, r, s](f32(X[n, c, y + r, x + s]) * f32(Wt[f, c, r, s]))
}
""",
}
HALF_SOURCES["hconvp"] = """
op hconvp[P = 1](X: f16[N, C, H, W], Wt: f16[F, C, KH, KW], b: f16[F])
    -> Y: f16[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = f16(max(sum[c, r, s](f32(Xp[n, c, y + r, x + s]) * f32(Wt[f, c, r, s])) + f32(b[f]), 0.0))
}
"""
HALF_SOURCES["hlin"] = """
op hlin(A: f16[M, K], W: f16[N, K]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(W[j, k]))
}
"""
TENSOR_CORE_CASES = [("hmm", dict(M=7, K=33, N=5)), ("hmm", dict(M=256, K=256, N=256)),
                     ("hmm", dict(M=200, K=1000, N=72)), ("hmm", dict(M=2, K=16, N=2)),
                     ("hmm", dict(M=129, K=72, N=200)), ("hmm", dict(M=300, K=40, N=136)),
                     ("hbmm", dict(B=3, M=19, K=21, N=35)), ("hbmm", dict(B=3, M=19, K=24, N=40)),
                     ("hlin", dict(M=100, K=64, N=72)), ("hlin", dict(M=130, K=200, N=257)),
                     ("hconv", dict(N=2, C=13, H=15, W=17, F=24)), ("hconv", dict(N=2, C=16, H=15, W=17, F=24)),
                     ("hconvp", dict(N=3, C=8, H=7, W=9, F=33, KH=3, KW=3)),
                     ("hconvp", dict(N=1, C=24, H=1, W=1, F=7, KH=3, KW=3)),
                     ("hconvp", dict(N=1, C=16, H=7, W=9, F=33, KH=3, KW=3)),
                     ("hconvp", dict(N=2, C=64, H=56, W=56, F=64, KH=3, KW=3)),
                     ("hconvp", dict(N=2, C=32, H=20, W=33, F=130, KH=5, KW=2))]


@pytest.mark.parametrize("name,case", GEMM_CASES + TENSOR_CORE_CASES,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(GEMM_CASES + TENSOR_CORE_CASES)])
def test_tiled_contractions_match_reference(name, case, rng):
    src = HALF_SOURCES.get(name, BMM if name == "bmm" else EXAMPLES / f"{name}.tc")
    lib = tcc.compile(src, target="cuda")
    op = lib[name]
    cparams = {k: v for k, v in case.items() if k in op.te.cparams}
    bindings = {**op.te.cparams, **case}
    assert "__syncthreads" in op.stage_text(bindings, "cuda")  # the tiled schedule, not one thread per output
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    (out,) = _poisoned(expected)
    op(*args, out=out, **cparams)
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, name)


def test_bf16_contraction_on_tensor_cores(rng):
    """bf16 operands (PyTorch tensors: NumPy has no bf16) widened to f32, at odd sizes."""
    torch = _torch()
    op = tcc.compile("op bhmm(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] "
                     "{ C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }", target="cuda").bhmm
    for m, k, n in ((131, 77, 190), (131, 80, 192)):  # the register-staged kernel, then cp.async
        assert "mma.sync" in op.stage_text(dict(M=m, K=k, N=n), "ptx")
        a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda().bfloat16()
        b = torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32)).cuda().bfloat16()
        out = torch.full((m, n), float("nan"), device="cuda")
        op(a, b, out=out)
        torch.testing.assert_close(out, a.double().matmul(b.double()).float(), rtol=1e-5, atol=1e-4)



@pytest.mark.parametrize("n,c,h,w,f", [(3, 8, 7, 9, 33), (2, 64, 56, 56, 64)])
def test_bf16_convolution_as_implicit_gemm(n, c, h, w, f, rng):
    """bf16 convolution + bias + relu (PyTorch tensors: NumPy has no bf16) through the channels-last
    implicit GEMM, against PyTorch's in float64 of the same bf16 values, result rounded to bf16."""
    torch = _torch()
    src = HALF_SOURCES["hconvp"].replace("f16", "bf16")
    op = tcc.compile(src, target="cuda").hconvp
    x, wt, b = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)).cuda().bfloat16()
                for s in ((n, c, h, w), (f, c, 3, 3), (f,)))
    out = torch.full((n, f, h, w), float("nan"), device="cuda", dtype=torch.bfloat16)
    op(x, wt, b, out=out)
    want = torch.relu(torch.nn.functional.conv2d(x.double(), wt.double(), b.double(), padding=1)).bfloat16()
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)

# ---------------------------------------------------------------- repeat calls (the fast path)

def test_repeat_calls_take_the_plan_and_still_check(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(lib.axpy(2.0, x, y), 2.0 * x + y)
    assert lib.axpy.plans, "a checked torch call leaves a plan for the next"
    z = torch.empty(1000, device="cuda")
    for _ in range(2):
        assert lib.axpy(3.0, x, y, out=z) is z
        torch.testing.assert_close(z, 3.0 * x + y)
    with pytest.raises(TccError, match="argument Y of axpy must be f32"):
        lib.axpy(1.0, x, y.double())
    with pytest.raises(TccError, match="symbol N"):
        lib.axpy(1.0, x, y[:999])
    with pytest.raises(TccError, match="f32 scalar"):
        lib.axpy("2", x, y)
    x0 = x.clone()
    lib.axpy(1.0, x, y, out=x)  # out= overlapping an input: computed into a temporary
    torch.testing.assert_close(x, x0 + y)


def test_repeat_calls_follow_the_current_stream(rng):
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "softmax.tc", target="cuda")
    x = torch.randn(64, 300, device="cuda")
    lib.softmax(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = lib.softmax(x)
    s.synchronize()
    torch.testing.assert_close(y, torch.softmax(x, dim=1))


# ---------------------------------------------------------------- aligned variants and their fallbacks

def _misaligned(t, offset: int):
    """A contiguous copy of ``t`` whose data starts ``offset`` elements into a fresh buffer."""
    torch = _torch()
    flat = torch.full((t.numel() + 16,), float("nan"), dtype=t.dtype, device=t.device)
    view = flat[offset:offset + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous()
    return view


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_flat_kernels_aligned_and_misaligned(offset):
    """axpy and bias_relu with views at every 4-byte offset: the float4 kernel or its fallback."""
    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x, y = torch.randn(4096 + 64, device="cuda"), torch.randn(4096 + 64, device="cuda")
    xv, yv = _misaligned(x, offset), _misaligned(y, (offset * 3) % 4)
    out = _misaligned(torch.full_like(x, float("nan")), offset)
    for _ in range(2):  # the checked path, then the plan
        assert lib.axpy(2.5, xv, yv, out=out) is out
        torch.testing.assert_close(out, 2.5 * x + y)
        torch.testing.assert_close(lib.axpy(2.5, xv, yv), 2.5 * x + y)
    br = tcc.compile(EXAMPLES / "bias_relu.tc", target="cuda").bias_relu
    a, g = torch.randn(33, 1028, device="cuda"), torch.randn(1028, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(br(_misaligned(a, offset), g), torch.relu(a + g))


@pytest.mark.parametrize("offset", [0, 1, 4, 8])
def test_tensor_core_kernel_aligned_and_misaligned(offset):
    """hmm with operands at half-element offsets: cp.async needs 16 bytes (offset 0 or 8)."""
    torch = _torch()
    hmm = tcc.compile(EXAMPLES / "hmm.tc", target="cuda").hmm
    a = torch.randn(136, 96, device="cuda").half()
    b = torch.randn(96, 264, device="cuda").half()
    want = a.double() @ b.double()
    av, bv = _misaligned(a, offset), _misaligned(b, 0)
    for _ in range(2):
        out = torch.full((136, 264), float("nan"), device="cuda")
        hmm(av, bv, out=out)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(hmm(av, bv).double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("offset", [0, 1])
def test_tf32_gemm_aligned_and_misaligned(offset):
    """The TF32 warpgroup GEMM: B transposed, then cp.async copies (16-byte aligned A), or the
    register-staged kernel for an A one float off."""
    torch = _torch()
    mm = tcc.compile(EXAMPLES / "matmul.tc", target="cuda", tf32=True).matmul
    a, b = torch.randn(260, 132, device="cuda"), torch.randn(132, 201, device="cuda")
    want = a.double() @ b.double()
    av = _misaligned(a, offset)
    for _ in range(2):  # the checked path, then the plan
        out = torch.full((260, 201), float("nan"), device="cuda")
        mm(av, b, out=out)
        err = ((out.double() - want).norm() / want.norm()).item()
        assert err < 2e-3, err


WITH_T = """
op with_t(X: f32[N]) -> Y: f32[N] {
    T[i] = exp(X[i])
    Y[i] = T[i] + T[N - 1 - i]
}
"""


def test_intermediates_come_from_a_workspace_kept_per_stream(rng):
    """An op with intermediates, called and synchronised in a loop, allocates them once per stream
    (each call used to allocate and free them); another stream gets its own, and the answers stay right."""
    from tcc.codegen_cuda import driver

    torch = _torch()
    op = tcc.compile(WITH_T, target="cuda").with_t

    def want(x):
        return x.exp() + x.exp().flip(0)

    assert op.kernel({"N": 1001}).temps, "T is kept in device memory between two kernels"
    x = torch.randn(1001, device="cuda")
    torch.testing.assert_close(op(x), want(x))
    torch.cuda.synchronize()
    held = tcc.cuda.allocated_bytes()
    for _ in range(3):
        x = torch.randn(1001, device="cuda")
        out = torch.full_like(x, float("nan"))
        op(x, out=out)
        torch.testing.assert_close(out, want(x))
        torch.testing.assert_close(op(x), want(x))
        torch.cuda.synchronize()
    assert tcc.cuda.allocated_bytes() == held
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = op(x)
    s.synchronize()
    torch.testing.assert_close(y, want(x))
    assert tcc.cuda.allocated_bytes() > held
    ctx = driver.context(x.device.index)
    assert ctx.pool_attribute(driver.MEMPOOL_ATTR_RELEASE_THRESHOLD) == driver.POOL_RELEASE_THRESHOLD


def test_workspaces_of_concurrent_streams_do_not_alias(rng):
    """Calls queued on two streams without synchronising between them, each on its own inputs:
    each stream's calls use that stream's intermediates, so every result is its own input's."""
    torch = _torch()
    op = tcc.compile(WITH_T, target="cuda").with_t
    n = 1 << 20  # many blocks: two kernels, T between them in the workspace
    assert len(op.kernel({"N": n}).meta["kernels"]) >= 2 and op.kernel({"N": n}).temps
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = [torch.randn(n, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    results = []
    for i, x in enumerate(inputs):  # the checked path first, then the plans of each stream
        with torch.cuda.stream(streams[i % 2]):
            out = torch.full_like(x, float("nan"))
            results.append(op(x, out=out) if i % 4 < 2 else op(x))
    torch.cuda.synchronize()
    for x, y in zip(inputs, results):
        torch.testing.assert_close(y, x.exp() + x.exp().flip(0))


def test_workspaces_per_shape_and_freed_with_their_kernel(rng):
    """Two shapes of one op: a kernel and a workspace each, reused by repeat calls; a kernel's
    workspaces go when the kernel does."""

    from tcc.codegen_cuda import driver
    from tcc.runtime import cuda as cuda_backend

    torch = _torch()
    op = tcc.compile(WITH_T, target="cuda").with_t
    xs = [torch.randn(n, device="cuda") for n in (1001, 5003)]
    for x in xs:
        torch.testing.assert_close(op(x), x.exp() + x.exp().flip(0))
    torch.cuda.synchronize()
    held = tcc.cuda.allocated_bytes()
    for _ in range(3):
        for x in xs:
            torch.testing.assert_close(op(x), x.exp() + x.exp().flip(0))
    torch.cuda.synchronize()
    assert tcc.cuda.allocated_bytes() == held
    ctx = driver.context(xs[0].device.index)
    target = cuda_backend.machine(None, {"arch": ctx.arch})
    kernel = cuda_backend.load("with_t", cuda_backend.build(op.lowered({"N": 7777}).scheduled, target))
    kernel.workspace(ctx.ordinal, 0, "with_t")
    assert tcc.cuda.allocated_bytes() == held + 7777 * 4
    del kernel
    gc.collect()
    assert tcc.cuda.allocated_bytes() == held


def test_a_planned_call_from_a_new_thread_makes_the_context_current(rng):
    """The fast path does not ask which context is current: on a thread where none is, the launch is
    refused, the context made current and the launch repeated."""
    import threading

    torch = _torch()
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    z = torch.full_like(x, float("nan"))
    lib.axpy(2.0, x, y, out=z)  # checked, leaves the plan
    z.fill_(float("nan"))
    torch.cuda.synchronize()
    errors = []

    def call() -> None:
        try:
            lib.axpy(2.0, x, y, out=z)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    worker.join(timeout=60)
    assert not errors
    torch.testing.assert_close(z, 2.0 * x + y)


def test_a_planned_call_still_checks_integer_ranges(rng):
    torch = _torch()
    op = tcc.compile("op f(n: i32, X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * f32(n) }", target="cuda").f
    x = torch.randn(33, device="cuda")
    for n in (3, 5):
        torch.testing.assert_close(op(n, x), x * n)
    with pytest.raises(TccError, match="out of"):
        op(1 << 40, x)
    torch.testing.assert_close(op(-7, x), x * -7)
