"""Schedules size their work by the target (CudaTarget.shared_memory_per_block, the registers a
thread may use, max_threads_per_block), not by constants: given a smaller budget, the
auto-scheduler's GEMM tiles (tensor-core ones too: smaller tiles, fewer slots, never the FMA
GEMM where a tensor-core tile fits), the user's cache(T, L, shared) and bind, and the CUDA C all
keep to it, and the kernels still compute the right numbers (checked by the CPU simulator of
scheduled CUDA loop IR, tests/gpu_sim.py)."""

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccScheduleError
from tcc.ir.loops import Allocate, For, Mma, Seq, WarpgroupMma, walk_stmts
from tcc.passes.autoschedule_cuda import gemm
from tcc.target import CudaTarget

MATMUL = "op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
SMALL = CudaTarget(shared_per_block=4 << 10, shared_per_block_optin=8 << 10)


def _shared_bytes(func) -> int:
    return sum(s.buffer.size * s.buffer.dtype.itemsize for s in walk_stmts(func.body)
               if isinstance(s, Allocate) and s.buffer.scope == "shared")


def test_the_gemm_tiles_fit_a_smaller_budget():
    large = dict(M=1024, K=64, N=1024)
    big = tcc.compile(MATMUL, target="cuda").mm.lowered(large).scheduled
    op = tcc.compile(MATMUL, target=SMALL).mm
    assert _shared_bytes(big) > SMALL.shared_memory_per_block >= _shared_bytes(op.lowered(large).scheduled) > 0
    small = op.lowered(dict(M=40, K=24, N=36)).scheduled
    assert 0 < _shared_bytes(small) <= SMALL.shared_memory_per_block
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 36)).astype(np.float32)
    arrays = {"A": a, "B": b, "C": np.full((40, 36), np.nan, np.float32)}
    gpu_sim.run(small, arrays)
    np.testing.assert_allclose(arrays["C"], a @ b, rtol=1e-4, atol=1e-4)


def test_shared_memory_beyond_the_static_part_is_dynamic():
    pytest.importorskip("cuda.bindings.nvrtc")
    source = tcc.compile(MATMUL, target=SMALL).mm.stage_text(dict(M=40, K=24, N=36), "cuda")
    assert "extern __shared__" in source  # over SMALL's 4 KiB of static shared memory


def test_a_users_shared_tile_must_fit_the_target():
    steps = "bind(i, block); bind(j, thread); split(k, 4096, ko, ki); cache(A, ko, shared)"  # a 16 KiB tile
    a, b = np.ones((8, 4096), np.float32), np.ones((4096, 8), np.float32)
    tcc.compile(MATMUL, target="cuda").mm.schedule(steps).lower(a, b, stage="scheduled")
    too_big = tcc.compile(MATMUL, target=SMALL).mm.schedule(steps)
    with pytest.raises(TccScheduleError, match="over 8192"):
        too_big.lower(a, b, stage="scheduled")


# ---------------------------------------------------------------- tensor-core tiles sized by the budget

HMM = "op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }"


def _part(**limits) -> CudaTarget:
    """The default sm_90 part with smaller limits (shared memory: the opt-in and the static part)."""
    shared = limits.pop("shared", None)
    if shared is not None:
        limits.update(shared_per_block=min(shared, 48 << 10), shared_per_block_optin=shared)
    return CudaTarget(**limits)


def _kernels(func) -> list:
    body = func.body
    while isinstance(body, Allocate):
        body = body.body
    return list(body.stmts) if isinstance(body, Seq) else [body]


def _per_kernel_shared(func) -> list[int]:
    return [gemm.shared_footprint([s.buffer for s in walk_stmts(k) if isinstance(s, Allocate)
                                   and s.buffer.scope == "shared"]) for k in _kernels(func)]


def _operand_tiles(func) -> list[tuple[int, ...]]:
    """The shapes of the shared operand tiles, kernel by kernel: (slots, rows, columns)."""
    return [s.buffer.shape for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "shared"]


def _instructions(func) -> set[str]:
    return {type(s).__name__ for s in walk_stmts(func.body) if isinstance(s, (Mma, WarpgroupMma))}


@pytest.mark.parametrize("limit, wgmma", [(227 << 10, True), (100 << 10, True), (48 << 10, False)])
def test_tensor_core_gemm_keeps_to_a_smaller_shared_memory(limit, wgmma):
    """The same f16 GEMM for sm_90 parts of 227, 100 and 48 KiB per block: still on tensor cores
    (wgmma in 4, then 3 slots; mma.sync where no wgmma tile fits 48 KiB), every kernel within
    the limit, never the FMA GEMM."""
    sizes = dict(M=2048, K=1024, N=2048)
    func = tcc.compile(HMM, target=_part(shared=limit)).hmm.lowered(sizes).scheduled
    assert max(_per_kernel_shared(func)) <= limit
    assert ("WarpgroupMma" in _instructions(func)) == wgmma and "Mma" in _instructions(func)
    slots = {shape[0] for shape in _operand_tiles(func)}
    assert slots == ({4, 2} if limit > 200 << 10 else {3, 2} if wgmma else {2})


def test_tensor_core_tiles_of_a_smaller_budget_compute_the_product():
    """The 100 KiB part's 3-slot wgmma kernel (four k-steps: every slot reused) and the 48 KiB
    part's mma.sync kernels (the copy-engine one and the register-staged fallback), run by the
    simulator on small GEMMs at odd sizes: the f32 sums of the f16 products."""
    rng = np.random.default_rng(7)
    for limit, (m, k, n), variants in ((100 << 10, (136, 200, 136), (True,)), (48 << 10, (40, 72, 24), (True, False))):
        func = tcc.compile(HMM, target=_part(shared=limit)).hmm.lowered(dict(M=m, K=k, N=n)).scheduled
        assert max(_per_kernel_shared(func)) <= limit and _instructions(func)
        a, b = (rng.standard_normal(s).astype(np.float16) for s in ((m, k), (k, n)))
        for aligned in variants:
            arrays = {"A": a, "B": b, "C": np.full((m, n), np.nan, np.float32)}
            gpu_sim.run(func, arrays, aligned=aligned)
            np.testing.assert_allclose(arrays["C"], a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_tf32_tiles_shrink_to_fit():
    """TF32 operands are 4 bytes: at 48 KiB the mma.sync tile shrinks to 64 x 64 (128 x 128 in two
    slots would take 74 KiB), and it still computes the product (simulated, odd sizes)."""
    target = _part(arch="sm_80", shared=48 << 10)
    op = tcc.compile(MATMUL, target=target, tf32=True).mm
    big = op.lowered(dict(M=2048, K=512, N=2048)).scheduled
    assert max(_per_kernel_shared(big)) <= 48 << 10 and "Mma" in _instructions(big)
    assert {shape[1] for shape in _operand_tiles(big)} == {64}
    m, k, n = 40, 72, 36
    small = op.lowered(dict(M=m, K=k, N=n)).scheduled
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    arrays = {"A": a, "B": b, "C": np.full((m, n), np.nan, np.float32)}
    gpu_sim.run(small, arrays, aligned=False)
    np.testing.assert_allclose(arrays["C"], a @ b, rtol=2e-2, atol=2e-2)


def test_the_register_budget_picks_smaller_warpgroup_tiles():
    """128 x 256 wgmma tiles hold 128 accumulators per thread: a part whose threads may use 160
    registers gets 128 x 128 tiles (64 accumulators) instead."""
    sizes = dict(M=4096, K=1024, N=4096)
    wide = tcc.compile(HMM, target="cuda").hmm.lowered(sizes).scheduled
    narrow = tcc.compile(HMM, target=_part(registers_per_thread=160)).hmm.lowered(sizes).scheduled
    assert max(max(shape[1:]) for shape in _operand_tiles(wide)) == 256
    assert max(max(shape[1:]) for shape in _operand_tiles(narrow)) == 128
    assert "WarpgroupMma" in _instructions(narrow)


# ---------------------------------------------------------------- threads per block from the target

SOFTMAX = """op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    Y[n, c] = e[n, c] / sum[c2](e[n, c2])
}"""


def _threads(func) -> set[int]:
    return {int(s.extent.value) for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "thread.x"}


def test_blocks_keep_to_a_smaller_thread_limit():
    """On a part whose blocks hold at most 128 threads, no kernel has more: the 256-thread GEMMs
    and split reductions give way to kernels of one thread per output, the flat and row kernels
    take 128 threads. The GEMM still computes the product (simulated, odd sizes)."""
    target = _part(max_threads_per_block=128)
    for source, name, sizes in ((MATMUL, "mm", dict(M=512, K=512, N=512)), (HMM, "hmm", dict(M=512, K=512, N=512)),
                                (SOFTMAX, "softmax", dict(N=64, C=4096)), (MATMUL, "mm", dict(M=2, K=1 << 20, N=2))):
        scheduled = getattr(tcc.compile(source, target=target), name).lowered(sizes).scheduled
        assert max(_threads(scheduled)) <= 128, (name, sizes)
        assert max(_threads(getattr(tcc.compile(source, target="cuda"), name).lowered(sizes).scheduled)) > 128
    small = tcc.compile(MATMUL, target=target).mm.lowered(dict(M=33, K=7, N=5)).scheduled
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((33, 7)).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    arrays = {"A": a, "B": b, "C": np.full((33, 5), np.nan, np.float32)}
    gpu_sim.run(small, arrays)
    np.testing.assert_allclose(arrays["C"], a @ b, rtol=1e-5, atol=1e-5)


def test_bind_keeps_to_the_targets_threads_per_block():
    steps = "split(j, 256, jo, ji); bind(i, block); bind(ji, thread)"
    a, b = np.ones((8, 16), np.float32), np.ones((16, 256), np.float32)
    tcc.compile(MATMUL, target="cuda").mm.schedule(steps).lower(a, b, stage="scheduled")
    with pytest.raises(TccScheduleError, match="more than the 128 threads"):
        tcc.compile(MATMUL, target=_part(max_threads_per_block=128)).mm.schedule(steps).lower(a, b, stage="scheduled")


@pytest.mark.cuda
@pytest.mark.parametrize("limit", [100 << 10, 48 << 10])
@pytest.mark.parametrize("sizes", [(1000, 520, 1032), (129, 72, 200)])
def test_smaller_tensor_core_tiles_on_the_device(limit, sizes, rng):
    """On a GPU: the f16 GEMM scheduled for a part of ``limit`` bytes per block (3-slot wgmma at
    100 KiB on sm_90, mma.sync at 48 KiB) compiles, launches and gives the reference's numbers."""
    from dataclasses import replace

    from tcc.testing import assert_matches, random_args, reference_results
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except tcc.TccError:
        pytest.skip("no CUDA GPU")
    from tcc.runtime import cuda as rt

    target = replace(rt.machine(None, {}), shared_per_block_optin=limit, shared_per_block=min(limit, 48 << 10))
    op = tcc.compile(HMM, target=target).hmm
    case = dict(zip("MKN", sizes))
    args = random_args(op.te, case, rng)
    (expected,) = reference_results(op.te, args, case)
    out = np.full((case["M"], case["N"]), np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, expected, op.te.tensors["C"].dtype)
