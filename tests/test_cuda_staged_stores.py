"""Tensor-core GEMM results through shared memory (tcc/passes/autoschedule_cuda/staged_stores.py):
the epilogue (bias, GELU in its erf and tanh forms, a residual, the cast) on the accumulators,
the tile staged over the operand tiles, then 16-byte stores; 16-bit results not staged stored in
column pairs. Checked by the simulator of scheduled CUDA loop IR (tests/gpu_sim.py: it also
checks each vector loop's alignment and that the operand tiles are not read once reused), by
NVRTC compiling the programs, and on a GPU against the reference with poisoned outputs, on the
wgmma and the mma.sync kernels, at odd and round sizes."""

from __future__ import annotations

from dataclasses import replace

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccArgumentError, TccError
from tcc.ir.loops import Allocate, For, LoopFunc, Mma, Seq, Stmt, WarpgroupMma, walk_stmts
from tcc.target import CudaTarget
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

SOURCE = """
op gemm16(A: f16[M, K], B: f16[K, N]) -> C: f16[M, N] {
    C[i, j] = f16(sum[k](f32(A[i, k]) * f32(B[k, j])))
}
op gemm_bf(A: bf16[M, K], B: bf16[K, N]) -> C: bf16[M, N] {
    C[i, j] = bf16(sum[k](f32(A[i, k]) * f32(B[k, j])))
}
op gemm32(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))
}
op gelu_erf(X: f16[M, K], W: f16[N, K], b: f16[N]) -> Y: f16[M, N] {
    Z[m, n] = sum[k](f32(X[m, k]) * f32(W[n, k])) + f32(b[n])
    Y[m, n] = f16(0.5 * Z[m, n] * (1.0 + erf(Z[m, n] * 0.7071067811865476)))
}
op gelu_tanh(X: bf16[M, K], W: bf16[N, K], b: bf16[N]) -> Y: bf16[M, N] {
    Z[m, n] = sum[k](f32(X[m, k]) * f32(W[n, k])) + f32(b[n])
    Y[m, n] = bf16(0.5 * Z[m, n] * (1.0 + tanh(0.7978845608028654 * (Z[m, n] + 0.044715 * Z[m, n] ** 3))))
}
op residual(X: f16[M, K], W: f16[K, N], b: f16[N], R: f16[M, N]) -> Y: f16[M, N] {
    Y[m, n] = f16(sum[k](f32(X[m, k]) * f32(W[k, n])) + f32(b[n]) + f32(R[m, n]))
}
op batched(A: f16[B, M, K], X: f16[B, K, N], s: f16[N]) -> C: f16[B, M, N] {
    C[b, i, j] = f16(max(sum[k](f32(A[b, i, k]) * f32(X[b, k, j])) + f32(s[j]), 0.0))
}
"""
HOPPER = CudaTarget()  # sm_90: wgmma
AMPERE = CudaTarget.for_arch("sm_80")  # mma.sync


def _op(name: str, target: CudaTarget, **options):
    return tcc.compile(SOURCE, target=target, **options)[name]


def _staged(func: LoopFunc | Stmt) -> bool:
    """Whether a shared tile takes the operand tiles' memory (the result staged)."""
    body = func.body if isinstance(func, LoopFunc) else func
    return any(isinstance(s, Allocate) and s.reuses for s in walk_stmts(body))


def _vectors(func: LoopFunc | Stmt) -> set[int]:
    """The lane counts of the vector loops."""
    body = func.body if isinstance(func, LoopFunc) else func
    return {int(s.extent.value) for s in walk_stmts(body) if isinstance(s, For) and s.kind == "vector"}


def _kernels(func: LoopFunc) -> list[Stmt]:
    body = func.body
    while isinstance(body, Allocate):  # (the function's global intermediates)
        body = body.body
    return list(body.stmts) if isinstance(body, Seq) else [body]


def _simulated(op, sizes: dict, aligned: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(the simulated result, poisoned first; the reference's) on fresh random inputs."""
    rng = np.random.default_rng(sum(sizes.values()))
    args = random_args(op.te, sizes, rng)
    (want,) = reference_results(op.te, args, sizes)
    out = np.full(want.shape, np.nan, want.dtype)
    gpu_sim.run(op.lowered(sizes).scheduled, {**dict(zip(op.te.params, args)), op.te.results[0]: out},
                aligned=aligned)
    return out, want


# ---------------------------------------------------------------- the decision (no GPU)

@pytest.mark.parametrize("name,target,sizes,options,staged,vectors", [
    ("gemm16", HOPPER, dict(M=256, K=64, N=256), {}, True, {2, 8}),  # staged: pairs into the tile, 16-byte copies
    ("gemm16", HOPPER, dict(M=256, K=64, N=256), dict(staged_stores="off"), False, {2}),  # direct, in pairs
    ("gemm16", HOPPER, dict(M=256, K=64, N=256), dict(staged_stores=False), False, {2}),
    ("gemm32", HOPPER, dict(M=256, K=64, N=256), {}, False, set()),  # f32 results: direct unless asked
    ("gemm32", HOPPER, dict(M=256, K=64, N=256), dict(staged_stores="all"), True, {2, 4}),
    ("gelu_erf", HOPPER, dict(M=256, K=64, N=250), {}, False, {2}),  # rows not 16-byte pieces: pairs
    ("gelu_erf", HOPPER, dict(M=256, K=64, N=131), {}, False, set()),  # odd rows: element by element
    ("gelu_tanh", AMPERE, dict(M=256, K=64, N=256), {}, True, {2, 8}),
])
def test_the_schedule_decides_how_results_are_stored(name, target, sizes, options, staged, vectors):
    func = _op(name, target, **options).lowered(sizes).scheduled
    assert _staged(func) == staged and _vectors(func) == vectors


def test_the_option_is_checked():
    with pytest.raises(TccArgumentError, match="staged_stores="):
        tcc.compile(SOURCE, target="cuda", staged_stores="sometimes")
    with pytest.raises(TccArgumentError, match="for target cuda"):
        tcc.compile(SOURCE, staged_stores=True)


# ---------------------------------------------------------------- simulated (no GPU)

SIMULATED = [  # (op, target, sizes, options, staged, its vector loops)
    ("gelu_erf", HOPPER, dict(M=130, K=64, N=136), {}, True, {2, 8}),  # wgmma, ragged M and N
    ("gelu_tanh", HOPPER, dict(M=128, K=32, N=256), {}, True, {2, 8}),  # wgmma, one 128 x 256 tile, bf16
    ("residual", HOPPER, dict(M=136, K=40, N=128), {}, True, {2, 8}),  # wgmma, B[k, n] and a residual read
    ("gelu_erf", HOPPER, dict(M=130, K=64, N=136), dict(staged_stores="off"), False, {2}),  # wgmma, direct pairs
    ("gemm32", HOPPER, dict(M=130, K=32, N=136), dict(staged_stores="all"), True, {2, 4}),  # wgmma, f32
    ("gemm16", AMPERE, dict(M=70, K=40, N=72), {}, True, {2, 8}),  # mma.sync
    ("gemm_bf", AMPERE, dict(M=100, K=24, N=72), {}, True, {2, 8}),  # mma.sync, bf16
    ("gelu_erf", AMPERE, dict(M=70, K=72, N=66), {}, False, {2}),  # mma.sync, rows of pairs: direct pairs
    ("gelu_erf", AMPERE, dict(M=70, K=64, N=33), {}, False, set()),  # mma.sync, odd rows: element by element
    ("batched", AMPERE, dict(B=2, M=70, K=32, N=64), {}, True, {2, 8}),  # a batch of tiles, bias and relu
]


@pytest.mark.parametrize("name,target,sizes,options,staged,vectors", SIMULATED,
                         ids=[f"{n}-{t.arch}-{'x'.join(map(str, s.values()))}-{o.get('staged_stores', 'auto')}"
                              for n, t, s, o, _, _ in SIMULATED])
def test_staged_and_paired_stores_in_the_simulator(name, target, sizes, options, staged, vectors):
    op = _op(name, target, **options)
    func = op.lowered(sizes).scheduled
    units = {type(s) for s in walk_stmts(func.body) if isinstance(s, (Mma, WarpgroupMma))}
    assert (WarpgroupMma in units) == (target is HOPPER) and _staged(func) == staged and _vectors(func) == vectors
    out, want = _simulated(op, sizes)
    assert_matches(out, want, op.te.tensors[op.te.results[0]].dtype, name)


def test_the_fallback_of_a_staged_kernel_in_the_simulator():
    """Misaligned pointers run the register-staged kernel, which stores element by element."""
    op = _op("gelu_erf", AMPERE)
    sizes = dict(M=70, K=64, N=72)
    assert _staged(op.lowered(sizes).scheduled)
    out, want = _simulated(op, sizes, aligned=False)
    assert_matches(out, want, op.te.tensors["Y"].dtype)


# ---------------------------------------------------------------- NVRTC (no GPU)

@pytest.mark.parametrize("name,target,sizes,mode", [("gelu_erf", HOPPER, dict(M=1000, K=1024, N=1000), "auto"),
                                                    ("gemm_bf", HOPPER, dict(M=4096, K=256, N=4096), "auto"),
                                                    ("gelu_tanh", AMPERE, dict(M=1000, K=520, N=1032), "auto"),
                                                    ("gemm32", HOPPER, dict(M=1000, K=1024, N=1000), "all")])
def test_staged_programs_compile(name, target, sizes, mode):
    """The staged kernels compile to cubins (sm_90a where they use wgmma) with 16-byte global
    stores, paired conversions and nothing in local memory; their register-staged fallbacks
    store element by element (their pointers may be misaligned)."""
    from tcc.runtime import cuda as rt

    op = _op(name, target, staged_stores=mode)
    kernels = _kernels(op.lowered(sizes).scheduled)
    assert len(kernels) == 2 and _staged(kernels[0]) and not _vectors(kernels[1]) and not _staged(kernels[1])
    ptx = op.stage_text(sizes, "ptx")
    assert "st.global.v4" in ptx and "ld.local" not in ptx and "st.local" not in ptx
    assert ("cvt.rn.f16x2.f32" in ptx) == (op.te.tensors[op.te.results[0]].dtype.name == "f16")
    assert rt._parse(rt.build(op.lowered(sizes).scheduled, op.target))[1][0].startswith(b"\x7fELF")


# ---------------------------------------------------------------- on the GPU

@pytest.fixture(scope="module")
def torch_gpu():
    torch = pytest.importorskip("torch")
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    return torch


def _device_target(path: str) -> CudaTarget:
    """The device, or the device with 48 KiB of shared memory a block (no wgmma tile fits: mma.sync)."""
    from tcc.runtime import cuda as rt

    device = rt.machine(None, {})
    return device if path == "wgmma" else replace(device, shared_per_block_optin=48 << 10,
                                                  shared_per_block=48 << 10)


def _on_device(torch, op, sizes: dict) -> None:
    rng = np.random.default_rng(sum(sizes.values()) + 1)
    args = random_args(op.te, sizes, rng)
    (want,) = reference_results(op.te, args, sizes)
    kinds = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    device = [torch.from_numpy(np.ascontiguousarray(a)).cuda().to(kinds[op.te.tensors[n].dtype.name])
              for n, a in zip(op.te.params, args)]
    result = op.te.tensors[op.te.results[0]]
    out = torch.full(want.shape, float("nan"), dtype=kinds[result.dtype.name], device="cuda")
    op(*device, out=out)
    assert_matches(out.float().cpu().numpy(), want, result.dtype, op.name)


ROUND_AND_RAGGED = [dict(M=256, K=128, N=512), dict(M=1000, K=1000, N=1000)]
ODD = [dict(M=1, K=7, N=33), dict(M=7, K=33, N=1000), dict(M=33, K=33, N=33), dict(M=1000, K=72, N=33)]


@pytest.mark.cuda
@pytest.mark.parametrize("path", ["wgmma", "mma.sync"])
@pytest.mark.parametrize("name", ["gemm16", "gemm_bf", "gelu_erf", "gelu_tanh", "residual"])
@pytest.mark.parametrize("sizes", ROUND_AND_RAGGED, ids=["round", "ragged"])
def test_staged_epilogues_on_the_gpu(torch_gpu, path, name, sizes):
    op = tcc.compile(SOURCE, target=_device_target(path))[name]
    func = op.lowered(sizes).scheduled
    assert _staged(func) and any(isinstance(s, WarpgroupMma) for s in walk_stmts(func.body)) == (path == "wgmma")
    _on_device(torch_gpu, op, sizes)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gemm16", "gelu_erf"])
@pytest.mark.parametrize("sizes", ODD, ids=lambda s: "x".join(map(str, s.values())))
def test_odd_sizes_on_the_gpu(torch_gpu, name, sizes):
    _on_device(torch_gpu, tcc.compile(SOURCE, target="cuda")[name], sizes)


@pytest.mark.cuda
@pytest.mark.parametrize("name,mode,sizes", [("gelu_erf", "off", dict(M=1000, K=1000, N=1000)),
                                             ("gelu_tanh", "off", dict(M=256, K=64, N=250)),
                                             ("gemm32", "all", dict(M=1000, K=1000, N=1000)),
                                             ("gemm32", "all", dict(M=256, K=128, N=512)),
                                             ("batched", "auto", dict(B=3, M=130, K=64, N=136))])
def test_other_modes_on_the_gpu(torch_gpu, name, mode, sizes):
    _on_device(torch_gpu, tcc.compile(SOURCE, target="cuda", staged_stores=mode)[name], sizes)


@pytest.mark.parametrize("name,mode", [("gemm16", "auto"), ("gemm16", "off"), ("gelu_erf", "auto"),
                                       ("gemm_bf", "auto")])
def test_ptxas_keeps_the_wgmma_pipeline(name, mode):
    """The f16-out GEMM's epilogue once converted each accumulator on its own, and ptxas then
    serialised the kernel's wgmma instructions (its note C7514: 0.61 of cuBLAS on an H200); the
    paired conversions of the staged and the direct stores keep them pipelined, nothing spilled."""
    from tcc.codegen_cuda import nvrtc

    op = _op(name, HOPPER, staged_stores=mode)
    report = nvrtc.ptxas_report(op.stage_text(dict(M=4096, K=4096, N=4096), "cuda"), "sm_90a")
    assert "C7514" not in report and " 0 bytes spill stores" in report, report


def test_a_dynamic_m_is_staged_in_the_simulator():
    """With M a kernel argument the last row tile's pieces are masked at run time."""
    op = tcc.compile(SOURCE, target=AMPERE, dynamic=["M"]).gemm16
    sizes = dict(M=70, K=40, N=72)
    func = op.lowered(sizes, dynamic=frozenset("M")).scheduled
    assert _staged(func)
    rng = np.random.default_rng(5)
    args = random_args(op.te, sizes, rng)
    (want,) = reference_results(op.te, args, sizes)
    out = np.full(want.shape, np.nan, want.dtype)
    gpu_sim.run(func, {"A": args[0], "B": args[1], "C": out}, scalars={"M": sizes["M"]})
    assert_matches(out, want, op.te.tensors["C"].dtype)


@pytest.mark.cuda
def test_a_dynamic_m_on_the_gpu(torch_gpu):
    op = tcc.compile(SOURCE, target="cuda", dynamic=["M"]).gelu_erf
    for m in (1000, 130, 7):
        _on_device(torch_gpu, op, dict(M=m, K=1000, N=1000))
