"""User schedules on target cuda: bind (blocks, threads), cache in shared memory, unroll, and the
CPU's loop primitives; bad ones are TccScheduleErrors at their step. Compiles without a GPU
(CI); runs against the reference on one."""

import numpy as np
import pytest

import tcc
from tcc.errors import TccError, TccScheduleError
from tcc.ir.loops import For, walk_stmts
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

AXPY = """
op axpy(a: f32, X: f32[N], Y: f32[N]) -> Z: f32[N] {
    Z[i] = a * X[i] + Y[i]
}
"""
MATMUL = """
op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j])
}
"""
ROWSUM = """
op rowsum(X: f32[N, C]) -> Y: f32[N] {
    Y[n] = sum[c](X[n, c])
}
"""
# (source, op, schedule, shapes): each runs against the reference at every shape
SCHEDULED = [
    (AXPY, "axpy", "split(i, 128, io, ii); bind(io, block); bind(ii, thread)",
     [dict(N=1), dict(N=7), dict(N=1000), dict(N=4097)]),
    (MATMUL, "matmul", "bind(i, block); bind(j, thread); unroll(k, 4)",
     [dict(M=1, K=1, N=1), dict(M=7, K=33, N=5), dict(M=33, K=1000, N=64)]),
    (MATMUL, "matmul", "decompose(C); split(k, 16, ko, ki); reorder(i, ko, j, ki); bind(i, block); "
                       "bind(j, thread); cache(A, ko, shared); cache(B, ko, shared)",
     [dict(M=1, K=1, N=1), dict(M=7, K=33, N=5), dict(M=33, K=40, N=128), dict(M=65, K=1000, N=33)]),
    (ROWSUM, "rowsum", "split(n, 32, no, ni); bind(no, block); bind(ni, thread); unroll(c, 8)",
     [dict(N=7, C=33), dict(N=1, C=1000), dict(N=100, C=7)]),
    (ROWSUM, "rowsum", "bind(n, block)", [dict(N=7, C=33)]),  # one thread per block
    # decompose leaves the reduction loops perfectly nested in the output loops: they stay serial
    (MATMUL, "matmul", "decompose(C)", [dict(M=7, K=33, N=5), dict(M=64, K=70, N=64)]),
    (MATMUL, "matmul", "decompose(C); reorder(i, k, j)", [dict(M=7, K=33, N=5)]),
    # a shared cache inside the thread loop: the block's threads run k together and share each copy
    (MATMUL, "matmul", "bind(i, block); bind(j, thread); cache(A, k, shared)", [dict(M=7, K=33, N=5)]),
    # local buffers with no parallel loop to stop at float to the function: each goes into its nest
    (MATMUL, "matmul", "cache(A, k); cache(B, k)", [dict(M=7, K=33, N=5), dict(M=64, K=70, N=64)]),
]


def _op(source: str, name: str, schedule: str):
    return tcc.compile(source, target="cuda")[name].schedule(schedule)


def _kinds(op, bindings) -> list[str]:
    func = op.lowered(bindings).scheduled
    return [s.kind for s in walk_stmts(func.body) if isinstance(s, For)]


def test_bound_loops_are_the_kernels():
    op = _op(AXPY, "axpy", "split(i, 128, io, ii); bind(io, block); bind(ii, thread)")
    assert _kinds(op, dict(N=1000)) == ["block.x", "thread.x", "block.x", "thread.x"]  # main part and tail
    assert op.stage_text(dict(N=1000), "ptx").count(".entry") == 2


def test_a_schedule_block_in_the_file():
    src = AXPY + "schedule axpy cuda {\n    split(i, 64, io, ii)\n    bind(io, block)\n    bind(ii, thread)\n}\n"
    op = tcc.compile(src, target="cuda").axpy
    assert _kinds(op, dict(N=128)) == ["block.x", "thread.x"]
    assert tcc.compile(src, target="cpu").axpy.user_schedule.steps == ()  # the cpu ignores a cuda block


def test_reduction_loops_of_a_decomposed_nest_stay_in_the_thread():
    """A fuzzer find: the flat schedule shared ``for k`` of ``C[i, j] = C[i, j] + ...`` among threads."""
    text = _op(MATMUL, "matmul", "decompose(C)").stage_text(dict(M=7, K=33, N=5), "scheduled")
    update = text.split("block.x")[-1]
    assert "for k in 0..33:" in update and "gid1 // 5" in update  # threads over (i, j); k serial


def test_unbound_nests_are_auto_scheduled():
    op = _op(MATMUL, "matmul", "decompose(C); bind(i, block); bind(j, thread)")
    kinds = _kinds(op, dict(M=33, K=7, N=64))
    assert kinds.count("block.x") >= 2 and "serial" in kinds  # the init nest, then the user's kernel


@pytest.mark.parametrize("case", SCHEDULED, ids=[f"{c[1]}:{c[2][:40]}" for c in SCHEDULED])
def test_scheduled_kernels_compile(case):
    source, name, schedule, shapes = case
    op = _op(source, name, schedule)
    for bindings in shapes:
        assert ".entry" in op.stage_text(bindings, "ptx")


def test_shared_caches_are_copied_by_all_threads_between_barriers():
    op = _op(MATMUL, "matmul", SCHEDULED[2][2])
    text = op.stage_text(dict(M=33, K=40, N=128), "scheduled")
    assert "in shared" in text and text.count("barrier") >= 2
    assert "__shared__" in op.stage_text(dict(M=33, K=40, N=128), "cuda")


BAD = [
    (AXPY, "parallel(i)", "parallel is a CPU primitive"),
    (AXPY, "vectorize(i)", "vectorize is a CPU primitive"),
    (AXPY, "bind(i, lane)", "unknown GPU axis 'lane'"),
    (AXPY, "bind(i, warp)", "more than the 32 warps"),
    (AXPY, "split(i, 64, io, ii); bind(ii, thread)", "not the outermost loop"),
    (AXPY, "split(i, 64, io, ii); bind(ii, block)", "not the outermost loop"),
    (AXPY, "bind(i, thread)", "more than the 1024 threads"),
    (MATMUL, "bind(i, block); bind(k, thread)", "a reduction"),
    (MATMUL, "bind(i, block); bind(j, block)", "also bound to blocks"),
    (MATMUL, "cache(A, k, shared)", "outside any loop bound to blocks"),
    (MATMUL, "bind(i, block); bind(j, thread); cache(B, k, shared)", "differs between threads of the block"),
    (MATMUL, "decompose(C); split(k, 16, ko, ki); reorder(i, ko, j, ki); bind(i, block); bind(j, thread); "
             "cache(C, ko, shared)", "it is written there"),
    (MATMUL, "cache(A, k, global)", "not supported on cuda"),
    (MATMUL, "bind(q, block)", "no loop 'q'"),
]


@pytest.mark.parametrize("source,schedule,message", BAD, ids=[b[1] for b in BAD])
def test_bad_schedules_are_errors_at_their_step(source, schedule, message):
    name = "axpy" if source is AXPY else "matmul"
    with pytest.raises(TccScheduleError, match=message) as info:
        op = _op(source, name, schedule)
        op.stage_text(dict(N=2000) if source is AXPY else dict(M=8, K=8, N=8), "scheduled")
    assert info.value.span is not None


def test_gpu_primitives_are_refused_on_the_cpu():
    with pytest.raises(TccScheduleError, match="bind is a GPU primitive"):
        tcc.compile(AXPY).axpy.schedule("bind(i, block)")
    with pytest.raises(TccScheduleError, match="shared memory is a GPU scope"):
        tcc.compile(MATMUL).matmul.schedule("cache(A, k, shared)")


@pytest.mark.cuda
@pytest.mark.parametrize("case", SCHEDULED, ids=[f"{c[1]}:{c[2][:40]}" for c in SCHEDULED])
def test_scheduled_kernels_match_reference(case, rng):
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")
    source, name, schedule, shapes = case
    op = _op(source, name, schedule)
    for bindings in shapes:
        args = random_args(op.te, bindings, rng)
        expected = reference_results(op.te, args, bindings)
        outs = [np.full(e.shape, np.nan, e.dtype) for e in expected]
        op(*args, out=outs[0] if len(outs) == 1 else tuple(outs))
        for r, got, want in zip(op.te.results, outs, expected):
            assert_matches(got, want, op.te.tensors[r].dtype, f"{name}.{r} at {bindings}")


def test_device_memory_from_a_schedule_is_an_error():
    with pytest.raises(TccScheduleError, match="would be in device memory, shared by every block") as info:
        _op(MATMUL, "matmul", "cache(B, i)").stage_text(dict(M=8, K=64, N=128), "scheduled")  # 32 KiB: global
    assert info.value.span is not None

