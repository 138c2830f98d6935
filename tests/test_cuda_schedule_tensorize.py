"""Tensor cores from a user's schedule: bind(L, warp), cache(T, L, shared) inside the thread loop
and tensorize(L, mma.sync) reach the loop IR's matrix statements (examples/matmul_tc.tc). The
lowering, its checks and NVRTC's compile of the CUDA C run anywhere, and so do the numbers on
small sizes, through a CPU simulator of the scheduled loop IR (tests/gpu_sim.py, itself checked
on the auto-scheduler's tensor-core kernels that ran on an H100); the GPU runs the rest."""

from pathlib import Path

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccError, TccScheduleError
from tcc.ir.loops import Allocate, AsyncCopy, Barrier, For, MatrixLoad, Mma, ProxyFence, WarpgroupMma, walk_stmts
from tcc.passes.loops.bind_lanes import lanes_of
from tcc.target import CudaTarget
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIZES = [dict(M=64, N=64, K=32), dict(M=128, N=192, K=96), dict(M=80, N=128, K=48), dict(M=16, N=64, K=16),
         dict(M=33, N=64, K=32), dict(M=64, N=128, K=40), dict(M=512, N=256, K=1024)]
HMM = "op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }"
HLIN = "op hlin(A: f16[M, K], W: f16[N, K]) -> C: f32[M, N] { C[i, j] = sum[k](f32(A[i, k]) * f32(W[j, k])) }"
# wgmma on sm_90: two warpgroups, each a 64 x 128 tile, 64 of k a step (one 128-byte swizzle atom)
WGMMA = ("decompose(C); tile(i, j, 128, 128, io, jo, ii, ji); split(ii, 64, wg, mi); split(k, 64, ko, ki); "
         "reorder(io, jo, wg, ko, mi, ji, ki); fuse(io, jo, blk); bind(blk, block); cache(C, wg, local, init); "
         "bind(wg, warpgroup); cache(A, ko, shared, swizzle, async); cache(B, ko, shared, swizzle, async); "
         "tensorize(mi, wgmma)")
STEPS = ("decompose(C); tile(i, j, 64, 64, io, jo, ii, ji); split(ii, 32, wi, mi); split(ji, 32, wj, ni); "
         "split(k, 32, ko, ki); reorder(io, jo, wi, wj, ko, mi, ni, ki); fuse(io, jo, blk); bind(blk, block); "
         "cache(C, wj, local); bind(wi, warp); bind(wj, warp); cache(A, ko, shared); cache(B, ko, shared); ")


def _example():
    return tcc.compile(EXAMPLES / "matmul_tc.tc", target="cuda").matmul_tc


def _hmm(steps: str):
    return tcc.compile(HMM, target="cuda").hmm.schedule(steps)


def test_the_example_reaches_mma_sync_with_user_steps_only():
    func = _example().lowered(dict(M=128, N=128, K=64)).scheduled
    fast, staged = func.body.stmts  # async copies, and plain ones; C's tiles start at 0 (no init kernel)
    for kernel, copies in ((fast, 4), (staged, 0)):
        assert isinstance(kernel, For) and kernel.kind == "block.x" and kernel.extent.value == 4  # 2 x 2 tiles
        threads = [s for s in walk_stmts(kernel) if isinstance(s, For) and s.kind == "thread.x"]
        assert len(threads) == 1 and threads[0].extent.value == 128
        assert str(lanes_of(threads[0])) == "wi:2,wj:2 lane=lane"
        stmts = list(walk_stmts(kernel))
        mma = [s for s in stmts if isinstance(s, Mma)]
        assert len(mma) == 1 and mma[0].shape == (16, 8, 16) and mma[0].kind == "f16"
        assert sum(isinstance(s, MatrixLoad) for s in stmts) == 2 and sum(isinstance(s, Barrier) for s in stmts) == 2
        assert sum(isinstance(s, AsyncCopy) for s in stmts) == copies  # A and B: first step, next step
    shared = {s.buffer.name: s.buffer.shape for s in walk_stmts(fast) if isinstance(s, Allocate)
              and s.buffer.scope == "shared"}
    assert sorted(shared.values()) == [(2, 32, 72), (2, 64, 40)]  # two slots, rows padded by 16 bytes
    assert _aligned(fast) and not _aligned(staged)
    text = _example().stage_text(dict(M=128, N=128, K=64), "scheduled")
    assert "mma.sync.m16n8k16.f16" in text and "ldmatrix.x4" in text  # --stage scheduled shows them


def _aligned(kernel) -> bool:
    return any(k == "aligned" for k, _ in kernel.annotations)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_example_compiles_through_nvrtc(arch):
    """The CUDA C of the user's schedule compiles to a cubin, with nothing spilled to local memory."""
    from tcc.runtime import cuda as rt

    op = tcc.compile(EXAMPLES / "matmul_tc.tc", target="cuda", arch=arch).matmul_tc
    for sizes in SIZES[:3]:
        scheduled = op.lowered(sizes).scheduled
        assert rt._parse(rt.build(scheduled, CudaTarget.for_arch(arch)))[1][0].startswith(b"\x7fELF")
    ptx = op.stage_text(SIZES[1], "ptx")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and "ldmatrix.sync.aligned" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


def test_a_warpgroup_schedule_reaches_wgmma():
    """bind(L, warpgroup), swizzled async tiles and tensorize(L, wgmma): sm_90a's matrix units."""
    from tcc.runtime import cuda as rt

    op = tcc.compile(HMM, target="cuda", arch="sm_90").hmm.schedule(WGMMA)
    func = op.lowered(dict(M=256, N=128, K=128)).scheduled
    fast = func.body.stmts[-2]
    stmts = list(walk_stmts(fast))
    wgmma = [s for s in stmts if isinstance(s, WarpgroupMma)]
    assert len(wgmma) == 1 and wgmma[0].shape == (64, 128, 16) and wgmma[0].trans_b  # B is [k][n]
    assert sum(isinstance(s, ProxyFence) for s in stmts) == 1
    assert all(s.buffer.swizzle == 128 for s in stmts if isinstance(s, Allocate) and s.buffer.scope == "shared")
    assert rt._parse(rt.build(func, CudaTarget.for_arch("sm_90")))[1][0].startswith(b"\x7fELF")
    ptx = op.stage_text(dict(M=256, N=128, K=128), "ptx")
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx and "ld.local" not in ptx


def test_the_example_runs_anywhere_on_the_cpu(rng):
    """The cuda block is the GPU's only: on the CPU the op is auto-scheduled, at any size."""
    op = tcc.compile(EXAMPLES / "matmul_tc.tc").matmul_tc
    for sizes in (dict(M=7, N=33, K=5), dict(M=64, N=64, K=32)):
        args = random_args(op.te, sizes, rng)
        expected = reference_results(op.te, args, sizes)
        out = np.full(expected[0].shape, np.nan, np.float32)
        op(*args, out=out)
        assert_matches(out, expected[0], op.te.tensors["C"].dtype, "matmul_tc")


BAD = [
    ("decompose(C); tensorize(i, mma.sync)", "not inside a loop bound to warps", "bind(LOOP, warp)"),
    (STEPS.replace("cache(A, ko, shared); ", "") + "tensorize(mi, mma.sync)", "operand A is not a shared buffer",
     "shared"),
    (STEPS + "tensorize(mi, wgmma)", "inside a loop bound to warps", "warpgroup"),
    (STEPS + "tensorize(ni, mma.sync)", "three perfectly nested loops", None),
    (STEPS.replace("split(ii, 32, wi, mi)", "split(ii, 8, wi, mi)").replace("bind(wj, warp); ", "")
     + "tensorize(mi, mma.sync)", "not made of whole instructions", None),
    (STEPS.replace("cache(C, wj, local); ", "") + "tensorize(mi, mma.sync)", "accumulator C is not indexed",
     "cache(C, LOOP, local)"),
    ("decompose(C); bind(i, block); split(k, 4, ko, kx); bind(kx, warp)", "a reduction", None),
    ("decompose(C); bind(i, block); split(j, 4, jo, ji); split(ji, 2, ja, jb); bind(jo, warp); bind(jb, warp)",
     "inside thread loop jo_t", None),
    ("decompose(C); split(i, 2, io, ii); bind(io, block); split(j, 16, jo, ji); bind(jo, warp); bind(ii, warp)",
     "contains thread loop", None),
    ("decompose(C); split(j, 8, jo, ji); bind(i, block); bind(jo, warp); bind(ji, warp)",
     "2048 threads per block, over 1024", None),
]


@pytest.mark.parametrize("steps,message,hint", BAD, ids=[b[1] for b in BAD])
def test_bad_tensor_core_schedules_are_errors_at_their_step(steps, message, hint):
    with pytest.raises(TccScheduleError, match=message) as info:
        _hmm(steps).stage_text(dict(M=64, N=64, K=32), "scheduled")
    assert info.value.span is not None
    if hint is not None:
        assert hint in (info.value.hint or "")


def test_spelling_of_the_new_steps_is_checked_up_front():
    with pytest.raises(TccScheduleError, match="unknown matrix instruction 'wmma'"):
        _hmm("tensorize(i, wmma)")
    with pytest.raises(TccScheduleError, match="cpu schedule cannot use it"):
        tcc.compile(HMM).hmm.schedule("tensorize(i, mma.sync)")
    with pytest.raises(TccScheduleError, match="unknown GPU axis 'lanes'"):
        _hmm("bind(i, lanes)")


def test_sizes_the_schedule_cannot_tile_are_errors():
    """The warp grid needs whole 32-column tiles (a split tail would be a second grid inside it);
    16-byte copies need rows of A a multiple of 8 halves long."""
    with pytest.raises(TccScheduleError, match="two copies"):
        _example().stage_text(dict(M=64, N=48, K=32), "scheduled")
    with pytest.raises(TccScheduleError, match="async copies move 16 bytes") as info:
        _example().stage_text(dict(M=64, N=64, K=33), "scheduled")
    assert "drop async" in info.value.hint


def test_tails_stay_plain_loops():
    """33 rows: the first 32 on tensor cores, the 33rd a nest that each lane of its warp runs in
    full; 40 of k: the last step's 8 run per accumulator element each lane holds."""
    from tcc.runtime import cuda as rt

    for sizes, grids in ((dict(M=33, N=64, K=32), 4), (dict(M=64, N=64, K=40), 2)):
        func = _example().lowered(sizes).scheduled
        assert sum(isinstance(s, Mma) for s in walk_stmts(func.body)) == 2  # the async kernel and its fallback
        threads = [s for s in walk_stmts(func.body) if isinstance(s, For) and lanes_of(s) is not None]
        assert len(threads) == grids
        assert rt._parse(rt.build(func, CudaTarget.for_arch("sm_80")))[1][0].startswith(b"\x7fELF")


def test_tiles_start_at_the_identity_only_where_each_is_loaded_once():
    with pytest.raises(TccScheduleError, match="loop ko around the tile does not pick a part of C"):
        _hmm(STEPS.replace("cache(C, wj, local)", "cache(C, ko, local, init)")).stage_text(
            dict(M=64, N=64, K=64), "scheduled")
    with pytest.raises(TccScheduleError, match="C has no init nest") as info:
        _hmm("bind(i, block); cache(C, j, local, init)").stage_text(dict(M=64, N=64, K=64), "scheduled")
    assert info.value.hint == "decompose(C) first"


def test_cache_options_are_checked():
    with pytest.raises(TccScheduleError, match="pad and swizzle are two layouts"):
        _hmm(STEPS.replace("cache(A, ko, shared)", "cache(A, ko, shared, pad, swizzle)")).stage_text(
            dict(M=64, N=64, K=32), "scheduled")
    with pytest.raises(TccScheduleError, match="cache option pad does not apply to local tiles"):
        _hmm("cache(A, k, local, pad)")
    with pytest.raises(TccScheduleError, match="unknown cache option 'tma'"):
        _hmm("cache(A, k, shared, tma)")
    with pytest.raises(TccScheduleError, match="is not inside a thread loop"):
        _hmm("decompose(C); split(k, 16, ko, ki); reorder(i, ko, j, ki); bind(i, block); bind(j, thread); "
             "cache(A, ko, shared, async)").stage_text(dict(M=64, N=64, K=32), "scheduled")


# ---------------------------------------------------------------- simulated (no GPU)

def _simulated(op, sizes, rng, aligned=True):
    """``op``'s scheduled loop IR run by the simulator on fresh random inputs, against the reference."""
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, np.float32)
    names = [p for p in op.te.params if p in op.te.tensors] + list(op.te.results)
    gpu_sim.run(op.lowered(sizes).scheduled, dict(zip(names, [*args, out])), aligned)
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, op.name)


def test_the_simulator_agrees_with_the_h100_on_the_auto_schedulers_wgmma_kernels(rng):
    """wgmma kernels the auto-scheduler emits for sm_90 (verified on an H100): B read [k][n]
    (transposed) and [n][k]."""
    for source in (HMM, HLIN):
        _simulated(next(iter(tcc.compile(source, target="cuda", arch="sm_90").ops.values())),
                   dict(M=128, N=128, K=64), rng)


@pytest.mark.parametrize("aligned", [True, False], ids=["cp.async", "staged"])
def test_the_simulator_agrees_with_the_h100_on_the_auto_schedulers_kernels(aligned, rng):
    """mma.sync kernels the auto-scheduler emits (verified on an H100): the copy-engine kernel with
    cp.async and its register-staged fallback, at a round and an odd size; and TF32."""
    op = tcc.compile(HMM, target="cuda", arch="sm_80").hmm
    for sizes in (dict(M=64, N=64, K=32), dict(M=33, N=40, K=24)):
        _simulated(op, sizes, rng, aligned)
    if aligned:
        tf32 = tcc.compile(EXAMPLES / "matmul.tc", target="cuda", arch="sm_80", tf32=True).matmul
        args = random_args(tf32.te, dict(M=33, N=40, K=24), rng)
        out = np.full((33, 40), np.nan, np.float32)
        gpu_sim.run(tf32.lowered(dict(M=33, N=40, K=24)).scheduled, dict(A=args[0], B=args[1], C=out))
        want = args[0].astype(np.float64) @ args[1].astype(np.float64)
        assert np.linalg.norm(out - want) / np.linalg.norm(want) < 2e-3


@pytest.mark.parametrize("sizes", [dict(M=130, N=129, K=36), dict(M=128, N=131, K=8)], ids=["odd", "short-k"])
def test_the_tf32_warpgroup_gemm_on_a_transposed_operand_simulated(sizes, rng):
    """sm_90 TF32: B[k, n] transposed by a kernel of its own into a K-major intermediate, then the
    cp.async warpgroup GEMM (edges zero-filled; N need not be a multiple of 4)."""
    tf32 = tcc.compile(EXAMPLES / "matmul.tc", target="cuda", arch="sm_90", tf32=True).matmul
    func = tf32.lowered(sizes).scheduled
    assert sum(isinstance(s, AsyncCopy) for s in walk_stmts(func.body)) >= 2
    args = random_args(tf32.te, sizes, rng)
    out = np.full((sizes["M"], sizes["N"]), np.nan, np.float32)
    gpu_sim.run(func, dict(A=args[0], B=args[1], C=out))
    want = args[0].astype(np.float64) @ args[1].astype(np.float64)
    assert np.linalg.norm(out - want) / np.linalg.norm(want) < 2e-3


HCONV = """op hconv[P = 1](X: f16[N, C, H, W], Wt: f16[F, C, KH, KW], b: f16[F])
    -> Y: f16[N, F, H + 2*P - KH + 1, W + 2*P - KW + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = f16(max(sum[c, r, s](f32(Xp[n, c, y + r, x + s]) * f32(Wt[f, c, r, s])) + f32(b[f]), 0.0))
}"""


@pytest.mark.parametrize("sizes,matrix", [(dict(N=2, C=16, H=5, W=6, F=8, KH=3, KW=3, P=1), Mma),
                                          (dict(N=1, C=8, H=7, W=3, F=33, KH=2, KW=3, P=0), Mma),
                                          (dict(N=1, C=8, H=12, W=11, F=9, KH=3, KW=3, P=1), WarpgroupMma)],
                         ids=["padded", "odd", "warpgroup"])
@pytest.mark.parametrize("half", ["f16", "bf16"])
def test_the_implicit_gemm_convolution_simulated(sizes, matrix, half, rng):
    """f16 convolution: a channels-last copy of the input (padding evaluated into it) and the
    weights in (r, s, c) order, then cp.async tiles of both into the mma.sync GEMM (channels x
    pixels) or, from 128 pixels on sm_90, the wgmma one (pixels x channels)."""
    op = tcc.compile(HCONV.replace("f16", half), target="cuda", arch="sm_90").hconv
    func = op.lowered(sizes).scheduled
    assert sum(isinstance(s, AsyncCopy) for s in walk_stmts(func.body)) >= 2
    assert any(isinstance(s, matrix) for s in walk_stmts(func.body))
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, args[0].dtype)
    gpu_sim.run(func, dict(X=args[0], Wt=args[1], b=args[2], Y=out))
    assert_matches(out, expected[0], op.te.tensors["Y"].dtype, "hconv")


SIMULATED = [s for s in SIZES if s["M"] * s["N"] * s["K"] <= 64 * 128 * 48]  # a few seconds each at most


@pytest.mark.parametrize("sizes", SIMULATED, ids=[f"{s['M']}x{s['N']}x{s['K']}" for s in SIMULATED])
def test_the_example_matches_the_reference_simulated(sizes, rng):
    _simulated(_example(), sizes, rng)


@pytest.mark.parametrize("aligned", [True, False], ids=["cp.async", "plain"])
def test_the_warpgroup_schedule_simulated(aligned, rng):
    op = tcc.compile(HMM, target="cuda", arch="sm_90").hmm.schedule(WGMMA)
    _simulated(op, dict(M=128, N=128, K=128), rng, aligned)


def test_the_examples_fallback_and_plain_copies_simulated(rng):
    """The kernel run where a pointer is not 16-byte aligned, and the schedule without pad/async."""
    _simulated(_example(), dict(M=80, N=64, K=48), rng, aligned=False)
    _simulated(_hmm(STEPS + "tensorize(mi, mma.sync)"), dict(M=64, N=64, K=33), rng)


# ---------------------------------------------------------------- on the GPU

GPU_SIZES = SIZES + [dict(M=256, N=256, K=192, arch="sm_90"), dict(M=1024, N=512, K=512, arch="sm_90")]


@pytest.mark.cuda
@pytest.mark.parametrize("sizes", GPU_SIZES, ids=[f"{s['M']}x{s['N']}x{s['K']}{'-wgmma' if 'arch' in s else ''}"
                                                  for s in GPU_SIZES])
def test_the_example_matches_the_reference(sizes, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    if "arch" in sizes:
        from tcc.codegen_cuda import driver

        if driver.device_target(0).arch != sizes["arch"]:
            pytest.skip("wgmma needs an sm_90 GPU")
    op = _example() if "arch" not in sizes else tcc.compile(HMM, target="cuda", arch="sm_90").hmm.schedule(WGMMA)
    sizes = {k: v for k, v in sizes.items() if k != "arch"}
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, expected[0], op.te.tensors["C"].dtype, "matmul_tc")
