"""The target value (tcc/target.py): schedules size their work from it, it is part of the cache
key, strings still name the default targets; on a GPU it is read from the device."""

import numpy as np
import pytest

import tcc
from tcc.errors import TccArgumentError, TccError
from tcc.ir.loops import For, walk_stmts
from tcc.runtime.backend import backend_for, kinds
from tcc.target import CpuTarget, CudaTarget
from tcc.testing import assert_matches, random_args, reference_results

SOURCE = """
op total(X: f32[M, N]) -> Y: f32[1] {
    Y[z] = sum[i, j](X[i, j])
}
"""


def _grids(op, bindings) -> list[int]:
    func = op.lowered(bindings).scheduled
    return [s.extent.value for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "block.x"]


def test_one_registry_names_the_kinds():
    """A kind's name and its Target value find the same backend; a target answers for itself."""
    assert kinds() == ("cpu", "cuda")
    assert backend_for("cuda") is backend_for(CudaTarget()) and backend_for("cpu").target_type is CpuTarget
    assert CudaTarget().is_gpu and not CpuTarget().is_gpu and CudaTarget().sms == 132
    assert CudaTarget().shared_memory_per_block == 227 << 10 and CpuTarget().shared_memory_per_block == 0
    assert "bind" in backend_for("cuda").primitives and "bind" not in backend_for("cpu").primitives
    lib = tcc.compile(SOURCE, target="cuda")
    assert lib.total.backend is backend_for("cuda") and lib.total.target.is_gpu  # read from the device where one is
    with pytest.raises(TccArgumentError, match="unknown target 'tpu'"):
        tcc.compile(SOURCE, target="tpu")
    with pytest.raises(TccArgumentError, match="unknown target"):
        tcc.compile(SOURCE, target=3)


MATMUL = "op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"


@pytest.mark.parametrize("cores", [1, 3])
def test_a_cpu_target_value_sizes_the_schedule(cores, rng):
    """The CPU auto-scheduler splits work over the target's cores and tiles for its caches,
    whatever this host has; the target's key separates the kernels."""
    target = CpuTarget(cores=cores, caches=((1, 48 << 10), (2, 2 << 20), (3, 32 << 20)))
    op = tcc.compile(MATMUL, target=target).mm
    bindings = dict(M=97, K=33, N=65)
    args = random_args(op.te, bindings, rng)
    out = np.full((97, 65), np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, reference_results(op.te, args, bindings)[0], op.te.tensors["C"].dtype, "C")
    kinds = {s.kind for s in walk_stmts(op.lowered(bindings).scheduled.body) if isinstance(s, For)}
    assert ("parallel" in kinds) == (cores > 1)
    assert op.cache_key(bindings) != tcc.compile(MATMUL).mm.cache_key(bindings)


def test_a_cpu_target_may_not_ask_for_features_this_cpu_lacks():
    with pytest.raises(TccArgumentError, match="not on this CPU"):
        tcc.compile(MATMUL, target=CpuTarget(features="+no-such-feature"))


def test_architecture_defaults():
    a100 = CudaTarget.for_arch("sm_80")
    assert a100.sms == 108 and a100.arch == "sm_80" and a100.shared_per_block_optin == 163 << 10
    assert CudaTarget.for_arch("sm_90a").sms == 132 and CudaTarget.for_arch("sm_90a").arch == "sm_90a"
    assert CudaTarget.for_arch("sm_120").arch == "sm_120"  # an unknown part: the defaults
    h100 = CudaTarget.for_arch("sm_90")
    for part in (a100, h100):  # the budgets every CUDA schedule reads
        assert part.registers_per_sm == part.registers_per_block == 65536 and part.registers_per_thread == 255
        assert part.max_threads_per_block == 1024 and part.max_threads_per_sm == 2048
    assert h100.thread_registers(256) == 255 and h100.thread_registers(1024) == 64
    assert h100.warpgroup_mma and CudaTarget.for_arch("sm_90a").warpgroup_mma and not a100.warpgroup_mma
    assert CudaTarget.for_arch("sm_86").max_threads_per_sm == 1536


def test_the_grid_follows_the_multiprocessors():
    pytest.importorskip("cuda.bindings.nvrtc")
    small = tcc.compile(SOURCE, target=CudaTarget(sms=16)).total
    big = tcc.compile(SOURCE, target=CudaTarget(sms=264)).total
    bindings = dict(M=8192, N=8192)
    assert _grids(small, bindings) == [16 * 8, 1] and _grids(big, bindings) == [264 * 8, 1]
    assert small.cache_key(bindings) != big.cache_key(bindings)
    assert "sm_90" in small.stage_text(bindings, "ptx").split(".target")[1][:10]


def test_the_architecture_of_a_given_target_is_compiled_for():
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(SOURCE, target=CudaTarget.for_arch("sm_80")).total
    assert ".target sm_80" in op.stage_text(dict(M=7, N=33), "ptx")


def _gpu() -> None:
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


def test_blocks_per_multiprocessor_follow_its_threads_and_registers():
    """A split reduction fills each SM with as many 256-thread blocks as it holds threads for (8 on
    an H100, 4 on a part of 1024); split-K with as many FMA GEMM blocks as its registers hold."""
    bindings = dict(M=8192, N=8192)
    assert _grids(tcc.compile(SOURCE, target=CudaTarget(sms=16, max_threads_per_sm=1024)).total, bindings) == [64, 1]
    skinny = dict(M=384, K=65536, N=384)  # nine 128 x 128 tiles: split-K's chunks make the grid
    full = _grids(tcc.compile(MATMUL, target=CudaTarget(sms=100)).mm, skinny)[0]
    half = _grids(tcc.compile(MATMUL, target=CudaTarget(sms=100, registers_per_sm=32768)).mm, skinny)[0]
    assert (full, half) == (9 * 22, 9 * 11)  # 2 and 1 blocks on each of the 100 SMs, in whole tiles


@pytest.mark.cuda
def test_the_device_is_read():
    _gpu()
    from tcc.codegen_cuda import driver
    from tcc.runtime import cuda as rt

    found = rt.machine(None, {"arch": driver.context(0).arch})
    assert found.arch == driver.context(0).arch and found.sms >= 1 and found.shared_per_block >= 48 << 10
    assert found.shared_per_block_optin >= found.shared_per_block and found.l2_bytes > 0
    assert found.registers_per_block >= 32768 and found.max_threads_per_sm >= found.max_threads_per_block >= 1024


@pytest.mark.cuda
@pytest.mark.parametrize("sms", [1, 7, 132])
def test_any_target_gives_the_right_answer(sms, rng):
    _gpu()
    op = tcc.compile(SOURCE, target=CudaTarget(sms=sms)).total
    for case in (dict(M=1000, N=1000), dict(M=33, N=7001)):
        args = random_args(op.te, case, rng)
        (expected,) = reference_results(op.te, args, case)
        out = np.full(1, np.nan, np.float32)
        op(*args, out=out)
        assert_matches(out, expected, op.te.tensors["Y"].dtype)


def test_an_avx2_target_gets_avx2_code_on_any_host(rng):
    """The CpuTarget alone decides LLVM's CPU and features: no AVX-512 register (zmm) in its
    assembly, whatever this host has, and the kernel still computes the right numbers here."""
    avx2 = CpuTarget(isa="haswell", features="+avx,+avx2,+fma,+f16c,-avx512f,-avx512dq,-avx512bw,-avx512vl")
    op = tcc.compile(MATMUL, target=avx2).mm
    args = [np.ones((64, 64), np.float32)] * 2
    text = op.lower(*args, stage="asm")
    assert "ymm" in text and "zmm" not in text
    bindings = dict(M=37, K=19, N=45)
    args = random_args(op.te, bindings, rng)
    assert_matches(op(*args), reference_results(op.te, args, bindings)[0], op.te.tensors["C"].dtype, "C")
    host = tcc.compile(MATMUL).mm
    if host.target.avx512:
        assert "zmm" in host.lower(*[np.ones((64, 64), np.float32)] * 2, stage="asm")
