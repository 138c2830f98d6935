"""One-block kernels merged into one (tcc/passes/autoschedule_cuda/merge_kernels.py): checked
against the reference through the CPU simulator of scheduled CUDA loop IR (tests/gpu_sim.py),
compiled through NVRTC, and on a GPU where there is one."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.ir.expr import Const
from tcc.ir.loopnest import subst
from tcc.ir.loops import Barrier, For, LoopFunc, Seq, walk_stmts
from tcc.target import CudaTarget
from tcc.testing import assert_matches, random_args, reference_results

pytest.importorskip("cuda.bindings.nvrtc")

# intermediates read across threads (T[N - 1 - i]): kept in memory between nests, not inlined
OPS = """
op with_t(X: f32[N]) -> Y: f32[N] {
    T[i] = exp(X[i])
    Y[i] = T[i] * T[N - 1 - i]
}
op chain(X: f32[N], s: f32) -> Y: f32[N] {
    T[i] = exp(X[i] * s)
    U[i] = tanh(T[N - 1 - i] - T[i])
    Y[i] = U[i] + U[(i + 3) % N] * X[i]
}
"""


def _kernels(func) -> list:
    body = func.body
    while not isinstance(body, (Seq, For)):
        body = body.body
    return list(body.stmts) if isinstance(body, Seq) else [body]


@pytest.mark.parametrize(("name", "sizes", "count"), [
    ("with_t", dict(N=256), 1), ("with_t", dict(N=33), 1), ("with_t", dict(N=1), 1),
    ("with_t", dict(N=1001), 2),  # four blocks: the second kernel must wait for all of the first
    ("chain", dict(N=7), 1), ("chain", dict(N=200), 1), ("chain", dict(N=300), 3),
])
def test_merged_kernels_match_the_reference_simulated(name, sizes, count, rng):
    op = getattr(tcc.compile(OPS, target="cuda"), name)
    func = op.lowered(sizes).scheduled
    kernels = _kernels(func)
    assert len(kernels) == count
    nests = len(_kernels(op.lowered(sizes).loops))  # statement nests before scheduling
    if count == 1:  # a barrier between each two bodies, inside the one thread loop
        assert sum(isinstance(s, Barrier) for s in walk_stmts(kernels[0])) == nests - 1
    args = random_args(op.te, sizes, rng)
    expected = reference_results(op.te, args, sizes)
    out = np.full(expected[0].shape, np.nan, np.float32)
    arrays = {n: a for n, a in zip(op.te.params, args) if isinstance(a, np.ndarray)}
    scalars = {n: a for n, a in zip(op.te.params, args) if not isinstance(a, np.ndarray)}
    _simulate(func, {**arrays, op.te.results[0]: out}, scalars)
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, name)


def _simulate(func, arrays, scalars) -> None:
    """The simulator with the function's scalar parameters bound as constants (it takes buffers)."""
    if scalars:
        consts = {n: Const(v, next(p.dtype for p in func.params if p.name == n)) for n, v in scalars.items()}
        func = LoopFunc(func.name, list(func.params), subst(func.body, consts), dict(func.attrs))
    gpu_sim.run(func, arrays)


def test_merged_kernels_compile_through_nvrtc():
    from tcc.runtime import cuda as rt

    lib = tcc.compile(OPS, target="cuda")
    for op, sizes in ((lib.with_t, dict(N=33)), (lib.chain, dict(N=200))):
        meta, (cubin,) = rt._parse(rt.build(op.lowered(sizes).scheduled, CudaTarget.for_arch("sm_90")))
        assert cubin.startswith(b"\x7fELF") and len(meta["kernels"]) == 1
        assert [name for name, _ in meta["kernels"][0]["params"]][:1] == ["X"]


@pytest.mark.cuda
def test_merged_kernels_on_the_gpu(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    lib = tcc.compile(OPS, target="cuda")
    for n in (1, 33, 256, 1001):
        x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
        t = x.exp()
        out = torch.full_like(x, float("nan"))
        for _ in range(2):  # the checked path, then the plan
            lib.with_t(x, out=out)
            torch.testing.assert_close(out, t * t.flip(0))
            torch.testing.assert_close(lib.with_t(x), t * t.flip(0))
        t = (x * 1.5).exp()
        u = (t.flip(0) - t).tanh()
        torch.testing.assert_close(lib.chain(x, 1.5), u + u.roll(-3) * x)


# Its derived gradient at N = 32 is one merged kernel in which thread 0 writes dL_sum[0] and all
# 32 threads read it after a barrier (examples/train_cnn.py's loss).
XENT = """
op xent(Z: f32[N, C], b: f32[C], T: f32[N, C]) -> L: f32[1] {
    m[n] = max[c](Z[n, c] + b[c])
    lse[n] = log(sum[c](exp(Z[n, c] + b[c] - m[n]))) + m[n]
    L[z] = sum[n](lse[n] - sum[c](T[n, c] * (Z[n, c] + b[c]))) / N
}
"""


def _xent_grad():
    return tcc.grad(tcc.compile(XENT, target="cuda").xent, wrt=["Z"])


def test_buffers_shared_through_a_barrier_are_not_restrict():
    """NVVM hoisted another thread's store's read above __syncthreads when the pointer was
    __restrict__ (wrong softmax gradients on the H100); read-only inputs keep it."""
    grad = _xent_grad()
    func = grad.lowered(dict(N=32, C=10)).scheduled
    assert len(_kernels(func)) == 1
    head = grad.stage_text(dict(N=32, C=10), "cuda").split("__global__")[1].split("{")[0]
    assert "float* dL_sum" in head and "float* m" in head, head
    assert "const float* __restrict__ Z" in head and "float* __restrict__ dZ" in head, head


@pytest.mark.cuda
def test_one_thread_writes_all_threads_read_on_the_gpu(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    grad = _xent_grad()
    for n, c in ((32, 10), (1, 7), (33, 10), (64, 33)):
        sizes = dict(N=n, C=c)
        args = random_args(grad.te, sizes, rng)
        expected = reference_results(grad.te, args, sizes)[0]
        got = grad(*[torch.from_numpy(a).cuda() for a in args]).cpu().numpy()
        assert_matches(got, expected, grad.te.tensors[grad.te.results[0]].dtype, f"xent grad {sizes}")
