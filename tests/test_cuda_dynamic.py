"""Shape-generic CUDA kernels (``tcc.compile(..., target="cuda", dynamic=...)``), without a GPU.

The schedules run on the simulator of scheduled CUDA loop IR (tests/gpu_sim.py) with the shape
symbols' values of each call, at odd and round sizes, against the reference; every example's
dynamic kernel compiles through NVRTC (or is refused with a TccError that says why); the launch
plan's grids and intermediates are formulas of the symbols; the automatic policy and the disk
cache find one kernel for every size. tests/test_cuda_dynamic_gpu.py runs them on a GPU.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc import dtypes
from tcc.codegen_cuda import driver, launch_sizes, nvrtc
from tcc.errors import TccCompileError, TccRuntimeError
from tcc.ir.expr import Binary, Const, Var
from tcc.ir.loops import Allocate, For, walk_stmts
from tcc.passes.autoschedule_cuda import rows
from tcc.runtime import cuda as cuda_runtime
from tcc.target import CudaTarget
from tcc.testing import assert_matches, reference_results

pytest.importorskip("cuda.bindings.nvrtc")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
I64 = dtypes.i64
BOOL = dtypes.boolean

ELEMENTWISE = """
op axpb(A: f32[S, N], B: f32[S, N]) -> C: f32[S, N] {
    C[i, j] = A[i, j] * 2.0 + B[i, j]
}
"""
HALF_MATMUL = """
op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) + 0.5
}
"""


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _f16(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def _simulate(op, symbols: tuple[str, ...], sizes: list[dict[str, int]], make, rng, aligned: bool = True) -> None:
    """Schedule ``op`` once with ``symbols`` dynamic (for the first of ``sizes``), then run that one
    scheduled function on the simulator at every size, into NaN-poisoned results."""
    func = op.lowered(sizes[0], dynamic=frozenset(symbols)).scheduled
    for bindings in sizes:
        args = make(rng, **bindings)
        want = reference_results(op.te, list(args), bindings)
        arrays = {p: a for p, a in zip(op.te.params, args) if p in op.te.tensors}
        arrays.update({r: np.full(w.shape, np.nan, w.dtype) for r, w in zip(op.te.results, want)})
        gpu_sim.run(func, arrays, aligned=aligned, scalars={s: bindings[s] for s in symbols})
        for r, w in zip(op.te.results, want):
            assert_matches(arrays[r], w, op.te.tensors[r].dtype, f"{r} at {bindings}")


def _op(source, name: str, symbols) -> tcc.compiler.Op:
    return tcc.compile(source, target="cuda", arch="sm_90", dynamic=symbols)[name]


@pytest.mark.parametrize("symbols, sizes", [
    (("S", "N"), [(3, 70), (1, 1), (7, 33), (2, 1000), (5, 64)]),  # the vector kernel where N % 4 == 0
    (("S",), [(3, 64), (1, 64), (33, 64)]),  # the innermost extent a multiple of 4: the vector kernel first
])
@pytest.mark.parametrize("aligned", [True, False])
def test_elementwise(rng, symbols, sizes, aligned):
    op = _op(ELEMENTWISE, "axpb", symbols)
    _simulate(op, symbols, [dict(S=s, N=n) for s, n in sizes], lambda rng, S, N: (_f32(rng, S, N), _f32(rng, S, N)),
              rng, aligned)


@pytest.mark.parametrize("symbols, sizes", [
    # a dynamic row: up to 4096 in registers (an aligned variant), longer ones through a global row
    (("N", "C"), [(3, 100), (1, 1), (7, 33), (2, 1000), (1, 4096), (1, 4097)]),
    (("N",), [(3, 100), (1, 100), (7, 100)]),  # a constant row: kept in registers
])
@pytest.mark.parametrize("aligned", [True, False])
def test_softmax(rng, symbols, sizes, aligned):
    op = _op(EXAMPLES / "softmax.tc", "softmax", symbols)
    _simulate(op, symbols, [dict(N=n, C=c) for n, c in sizes], lambda rng, N, C: (_f32(rng, N, C),), rng, aligned)


def test_layernorm(rng):
    op = _op(EXAMPLES / "layernorm.tc", "layernorm", ("N", "D"))
    _simulate(op, ("N", "D"), [dict(N=n, D=d) for n, d in ((3, 100), (1, 1), (7, 33), (2, 300), (1, 4100))],
              lambda rng, N, D: (_f32(rng, N, D), _f32(rng, D), _f32(rng, D)), rng)


def test_a_dynamic_row_keeps_its_values_in_registers_in_the_variant_of_its_length():
    """A variant per row length R of rows.BOUNDED_ROWS for the rows in (R / 2, R], each with the
    threads and steps a constant row of that length gets (a row of 1000: 4 steps of 256 threads,
    as at C = 1000); the plain kernel, its row in global memory, for longer rows."""
    op = _op(EXAMPLES / "softmax.tc", "softmax", ("N", "C"))
    func = op.lowered(dict(N=2, C=8), dynamic=frozenset("NC")).scheduled
    *variants, plain = func.body.body.stmts  # (inside the global row the plain kernel uses beyond the bound)
    c, lengths = Var("C", I64), rows.BOUNDED_ROWS
    assert [dict(v.annotations)["requires"] for v in variants] == [Binary("le", c, Const(lengths[0], I64), BOOL)] + \
        [Binary("and", Binary("lt", Const(r // 2, I64), c, BOOL), Binary("le", c, Const(r, I64), BOOL), BOOL)
         for r in lengths[1:]]
    assert plain.annotations == (("requires", Binary("lt", Const(lengths[-1], I64), c, BOOL)),)

    def registers(kernel):  # the thread's arrays: X's row and its exponentials
        return [s.buffer.shape for s in walk_stmts(kernel)
                if isinstance(s, Allocate) and s.buffer.name.startswith(("X_r", "e_r"))]
    for variant, length in zip(variants, lengths):
        threads = min(length, 256)
        assert {s.extent for s in walk_stmts(variant) if isinstance(s, For) and s.kind == "thread.x"} == \
            {Const(threads, I64)}
        assert registers(variant) == [(length // threads,)] * 2
    assert not registers(plain)


def test_the_launch_runs_the_row_variant_of_the_calls_length():
    kernel = _kernel(EXAMPLES / "softmax.tc", "softmax", ("N", "C"), dict(N=4, C=4))
    metas = kernel.meta["kernels"]
    for c, runs in ((1, 0), (32, 0), (33, 1), (1000, 5), (1024, 5), (1025, 6), (8192, 8), (8193, 9)):
        sized = []
        for meta in metas:  # (no GPU: names and grids only)
            launcher = driver.Launcher.__new__(driver.Launcher)
            launcher.name, launcher.grid, launcher.fallback = meta["name"], 0, None
            sized.append(cuda_runtime._sized(launcher, metas, dict(N=7, C=c), "softmax"))
        assert [(s.name, s.grid) for s in sized if s is not None] == [(metas[runs]["name"], 7)], c


def test_matmul_every_dim(rng):
    op = _op(EXAMPLES / "matmul.tc", "matmul", ("M", "N", "K"))
    _simulate(op, ("M", "N", "K"), [dict(M=m, N=n, K=k) for m, n, k in ((33, 7, 5), (1, 1, 1), (40, 65, 33))],
              lambda rng, M, N, K: (_f32(rng, M, K), _f32(rng, K, N)), rng)


@pytest.mark.parametrize("aligned, sizes", [(True, (1, 7, 0)), (False, (3,))])
def test_matmul_kernels_by_the_range_of_m(rng, aligned, sizes):
    """A dynamic M (K and N constant): a matrix-vector row kernel for M = 1, split-K for few rows
    (its chunk count by range), one tile a block for many, as constant sizes get them: one
    scheduled function run at an M of several ranges (misaligned: split-K's one-element sums)."""
    op = _op(EXAMPLES / "matmul.tc", "matmul", ("M",))
    func = op.lowered(dict(M=5, N=32, K=256), dynamic=frozenset("M")).scheduled
    assert func.attrs["kernel kinds"] == ("by M: row to 1 | split-K gemm to 2 | split-K gemm to 4 | "
                                          "split-K gemm to 24 | split-K gemm to 2048 | gemm",)
    _simulate(op, ("M",), [dict(M=m, N=32, K=256) for m in sizes],
              lambda rng, M, N, K: (_f32(rng, M, K), _f32(rng, K, N)), rng, aligned)


@pytest.mark.parametrize("source, name", [(EXAMPLES / "matmul.tc", "matmul"), (HALF_MATMUL, "hmm")])
def test_matmul_range_kernels_at_the_size_of_each_range(source, name):
    """M = 1, 7, 1000 and 8192 of a 512 x 512 weight run the kernels a constant M gets there, their
    grids and blocks the same (f32: a row kernel, split-K over 4 chunks of 32 x 32 tiles, over 2 of
    128 x 128 tiles, 128 x 128 tiles alone; f16: mma.sync tiles, then warpgroup ones); an aligned
    variant's fallback, which a range may share, left out."""
    kernel = _kernel(source, name, ("M",), dict(M=5, N=512, K=512))
    static = tcc.compile(source, target="cuda", arch="sm_90", dynamic=False)[name]
    for m in (1, 7, 1000, 8192):
        fixed = cuda_runtime.CudaKernel(name, cuda_runtime.build(static.lowered(dict(M=m, N=512, K=512)).scheduled,
                                                                 static.target))
        runs = [k for k in kernel.meta["kernels"] if launch_sizes.evaluate(k["requires"], dict(M=m))]
        assert [(launch_sizes.evaluate(k["grid"], dict(M=m)), k["block"], k["aligned"]) for k in _firsts(runs)] == \
            [(k["grid"], k["block"], k["aligned"]) for k in _firsts(fixed.meta["kernels"])], m
    if name == "hmm":
        return
    # split-K's partials (4 chunks to M = 48, 2 to 4096), each sized for its range's largest M
    assert [n for _, n in kernel.sizes(dict(M=8192))] == [4 * 48 * 512 * 4, 2 * 4096 * 512 * 4]
    assert [n for _, n in kernel.sizes(dict(M=7))] == [4 * 7 * 512 * 4, 2 * 7 * 512 * 4]


def _firsts(kernels: list[dict]) -> list[dict]:
    """``kernels`` less each aligned variant's fallback."""
    return [k for i, k in enumerate(kernels) if i == 0 or not kernels[i - 1]["aligned"]]


@pytest.mark.parametrize("source, name, symbols, bindings", [
    (EXAMPLES / "softmax.tc", "softmax", ("N", "C"), dict(N=7, C=1000)),
    (EXAMPLES / "layernorm.tc", "layernorm", ("N", "D"), dict(N=7, D=768)),
    (EXAMPLES / "matmul.tc", "matmul", ("M",), dict(M=7, K=512, N=512)),
    (EXAMPLES / "conv2d.tc", "conv2d", ("N",), dict(N=2, C=32, H=28, W=28, F=64, KH=3, KW=3, S=1, P=1, D=1)),
    (EXAMPLES / "conv2d.tc", "conv2d", ("N",), dict(N=2, C=32, H=6, W=6, F=32, KH=3, KW=3, S=1, P=1, D=1)),
    (HALF_MATMUL, "hmm", ("M",), dict(M=7, K=1024, N=1024)),
], ids=["softmax", "layernorm", "matmul_M", "conv_N", "conv_N_small", "hmm_M"])
def test_the_benchmarked_kernels_compile_and_one_range_runs_at_every_size(source, name, symbols, bindings):
    """benchmarks/dynamic.py's CUDA cases through NVRTC (and a convolution whose batch takes split-K
    while small); at every size of the ranged symbol from 0 to 9000 the conditions of exactly one
    range hold (an aligned variant and its fallback share one)."""
    kernel = _kernel(source, name, symbols, bindings)
    assert kernel.cubins and all(c.startswith(b"\x7fELF") for c in kernel.cubins)
    ranged = symbols[-1] if len(symbols) > 1 else symbols[0]  # (the row length; M)
    conditions = [k["requires"] for k in kernel.meta["kernels"] if k["requires"] is not None]
    assert len(conditions) > 2
    for size in range(9001):
        values = {**bindings, ranged: size}
        holding = {str(c) for c in conditions if launch_sizes.evaluate(c, values)}
        assert len(holding) == 1, (size, holding)


def _resident(source: str, kernels: list[dict]) -> dict[str, int]:
    """Blocks of each kernel an H100 multiprocessor holds at once, by ptxas's register count."""
    report = nvrtc.ptxas_report(source, "sm_90")
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S))
    machine = CudaTarget.for_arch("sm_90")
    return {k["name"]: min(machine.max_threads_per_sm // k["block"],
                           machine.registers_per_sm // (-(-int(used[k["name"]]) // 8) * 8 * k["block"]))
            for k in kernels}


@pytest.mark.parametrize("source, name, symbols, bindings, ranged", [
    (EXAMPLES / "softmax.tc", "softmax", ("N", "C"), dict(N=7, C=1000), "C"),
    (EXAMPLES / "layernorm.tc", "layernorm", ("N", "D"), dict(N=7, D=768), "D"),
    (EXAMPLES / "matmul.tc", "matmul", ("M",), dict(M=1000, K=512, N=512), "M"),
    (EXAMPLES / "matmul.tc", "matmul", ("M",), dict(M=8192, K=512, N=512), "M"),
], ids=["softmax", "layernorm", "matmul_M 1000", "matmul_M 8192"])
def test_a_ranges_kernels_fit_a_multiprocessor_as_the_specialised_ones(source, name, symbols, bindings, ranged):
    """At the benchmarked sizes the kernels a call runs hold as many blocks on a multiprocessor as
    the specialised ones (a 16-step row variant's 61-80 registers held a third of them)."""
    dynamic = _kernel(source, name, symbols, bindings)
    static = tcc.compile(source, target="cuda", arch="sm_90", dynamic=False)[name]
    fixed = cuda_runtime.CudaKernel(name, cuda_runtime.build(static.lowered(bindings).scheduled, static.target))
    values = {ranged: bindings[ranged]}
    runs = _firsts([k for k in dynamic.meta["kernels"]
                    if k["requires"] is None or launch_sizes.evaluate(k["requires"], values)])
    held = _resident(_op(source, name, symbols).stage_text(bindings, "cuda"), runs)
    want = _resident(static.stage_text(bindings, "cuda"), _firsts(fixed.meta["kernels"]))
    assert list(held.values()) == list(want.values()), (held, want)


@pytest.mark.parametrize("aligned", [True, False])
def test_tensor_core_gemm_dynamic_m(rng, aligned):
    """The copy-engine kernel (rows 16-byte aligned: K constant) and its register-staged fallback;
    the last tile's rows past M are masked (zero-filled copies, guarded stores)."""
    op = _op(HALF_MATMUL, "hmm", ("M",))
    _simulate(op, ("M",), [dict(M=m, N=64, K=64) for m in (33, 1)],
              lambda rng, M, N, K: (_f16(rng, M, K), _f16(rng, K, N)), rng, aligned)


def test_warpgroup_gemm_dynamic_m(rng):
    """Large enough for the H100's warpgroup kernel (128 x 256 tiles, constant K): the second row
    tile of M = 130 is two rows, the rest masked (mma.sync tiles for M <= 96, a row kernel at 1:
    kernels by the range of M, as constant sizes get them)."""
    op = _op(HALF_MATMUL, "hmm", ("M",))
    assert op.lowered(dict(M=256, N=256, K=64), dynamic=frozenset("M")).scheduled.attrs["kernel kinds"] == \
        ("by M: row to 1 | tensor-core gemm to 96 | warpgroup gemm",)
    _simulate(op, ("M",), [dict(M=130, N=256, K=64)], lambda rng, M, N, K: (_f16(rng, M, K), _f16(rng, K, N)), rng)


def test_tensor_core_gemm_every_dim(rng):
    op = _op(HALF_MATMUL, "hmm", ("M", "N", "K"))
    _simulate(op, ("M", "N", "K"), [dict(M=m, N=n, K=k) for m, n, k in ((33, 7, 5), (1, 1, 1))],
              lambda rng, M, N, K: (_f16(rng, M, K), _f16(rng, K, N)), rng)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.tc")), ids=lambda p: p.stem)
def test_examples_compile_through_nvrtc_or_say_why(path):
    lib = tcc.compile(path, target="cuda", arch="sm_90", dynamic=True)
    for name in lib._ops:
        op = lib[name]
        bindings = {s: 5 for s in op.te.symbols} | {c: 1 for c in op.te.cparams}
        try:
            artifact = cuda_runtime.build(op.lowered(bindings, dynamic=frozenset(op.te.symbols)).scheduled,
                                          op.target)
        except tcc.TccError as exc:  # a window's or a user schedule's extent: said so, with the source line
            assert exc.span is not None and ("window" in exc.message or "fuse" in exc.message), exc
            continue
        kernel = cuda_runtime.CudaKernel(name, artifact)
        assert kernel.cubins and all(c.startswith(b"\x7fELF") for c in kernel.cubins)


def _kernel(source, name: str, symbols, bindings) -> cuda_runtime.CudaKernel:
    op = _op(source, name, symbols)
    return cuda_runtime.CudaKernel(name, cuda_runtime.build(op.lowered(bindings, dynamic=frozenset(symbols)).scheduled,
                                                            op.target))


def test_the_launch_plan_computes_grids_and_intermediates_at_the_call():
    kernel = _kernel(ELEMENTWISE, "axpb", ("S", "N"), dict(S=4, N=4))
    assert kernel.symbols == ["N", "S"]
    vector, plain = kernel.meta["kernels"]  # 4 elements a thread, for calls where N is a multiple of 4
    for s, n in ((1, 1), (7, 33), (1000, 1000)):
        assert launch_sizes.evaluate(plain["grid"], dict(S=s, N=n)) == -(-s * n // plain["block"])
        assert launch_sizes.evaluate(vector["grid"], dict(S=s, N=n)) == -(-s * (n // 4) // vector["block"])
        assert launch_sizes.evaluate(vector["requires"], dict(S=s, N=n)) == (n % 4 == 0)
    assert {p for p, code in plain["params"] if code == "i64"} == {"S", "N"}
    assert "__builtin_assume(((N) & 3LL) == 0);" in _op(ELEMENTWISE, "axpb", ("S", "N")).stage_text(
        dict(S=4, N=4), "cuda")
    rows = _kernel(EXAMPLES / "softmax.tc", "softmax", ("N", "C"), dict(N=4, C=4))
    assert rows.sizes(dict(N=3, C=5)) == [("e", 60)]  # f32[N, C]
    assert rows.sizes(dict(N=0, C=5)) == [("e", 1)]  # (at least one byte)


def test_a_grid_over_cudas_limit_is_refused_at_the_call():
    kernel = _kernel(ELEMENTWISE, "axpb", ("S", "N"), dict(S=4, N=4))
    vector, plain = (driver.Launcher.__new__(driver.Launcher) for _ in range(2))  # (no GPU: names and grids only)
    vector.name, vector.grid = kernel.meta["kernels"][0]["name"], 0
    plain.name, plain.grid, plain.fallback = kernel.meta["kernels"][1]["name"], 0, None
    vector.fallback = plain
    sized = cuda_runtime._sized(vector, kernel.meta["kernels"], dict(S=7, N=33), "axpb")
    assert sized.name == plain.name and sized.grid == 1  # N % 4 != 0: the one-element kernel
    sized = cuda_runtime._sized(vector, kernel.meta["kernels"], dict(S=7, N=1024), "axpb")
    assert sized.name == vector.name and sized.grid == 7 and sized.fallback.grid == 28
    with pytest.raises(TccRuntimeError, match=r"blocks for N=1048576, S=1048576, over CUDA's grid limit"):
        cuda_runtime._sized(plain, kernel.meta["kernels"], dict(S=1 << 20, N=1 << 20), "axpb")


def test_the_automatic_policy_specialises_on_cuda_and_dynamic_opts_in(fresh_cache):
    """CUDA's dynamic kernels are slower than specialised ones (0.31-0.76 of their throughput on
    an H200), so there the automatic policy compiles each size; dynamic=True gives one kernel."""
    op = tcc.compile(EXAMPLES / "softmax.tc", target="cuda", arch="sm_90").softmax
    for n in (5, 6, 7):
        op.kernel(dict(N=n, C=11))
    assert op.compiles == 3
    op = tcc.compile(EXAMPLES / "softmax.tc", target="cuda", arch="sm_90", dynamic=True).softmax
    for n in (5, 6, 7, 300, 1):
        op.kernel(dict(N=n, C=11))
    assert op.compiles == 1


def test_a_window_is_refused_by_dynamic_and_specialised_by_the_automatic_policy(fresh_cache):
    bindings = dict(N=2, C=3, H=9, W=9, F=4, KH=3, KW=3, S=1, P=0, D=1)
    explicit = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", arch="sm_90", dynamic=("KH",)).conv2d
    with pytest.raises(TccCompileError, match="KH.*reduction axis after the first"):
        explicit.kernel(bindings)
    automatic = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", arch="sm_90").conv2d
    for kh in (1, 3, 5):  # the third: KH dynamic is tried, refused, and specialised instead
        automatic.kernel({**bindings, "KH": kh})
    assert automatic.compiles == 3


def test_a_new_process_finds_the_kernel_for_any_size(fresh_cache):
    script = textwrap.dedent(f"""
        import sys, tcc
        op = tcc.compile({ELEMENTWISE!r}, target="cuda", arch="sm_90", dynamic=True).axpb
        op.kernel(dict(S=3, N=int(sys.argv[1])))
        print(op.compiles, op.loads)
    """)
    runs = [subprocess.run([sys.executable, "-c", script, str(n)], capture_output=True, text=True, check=True)
            for n in (5, 77)]
    assert [r.stdout.split() for r in runs] == [["1", "0"], ["0", "1"]]
