"""Shape-generic CUDA kernels on a GPU: one kernel per op at sizes 1, 7, 33, 1000 and round ones,
against the reference, into poisoned results; NumPy arrays (the checked path) and PyTorch CUDA
tensors (the plans of the fast path, one per signature, each with its symbols' values); the
automatic policy; a new process. Skipped without a GPU (tests/test_cuda_dynamic.py checks the
same schedules on the simulator)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import child_pythonpath

import tcc
from tcc.errors import TccError
from tcc.testing import assert_matches, reference_results

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SIZES = (1, 7, 33, 1000, 64, 512)

ELEMENTWISE = """
op axpb(A: f32[S, N], B: f32[S, N]) -> C: f32[S, N] {
    C[i, j] = A[i, j] * 2.0 + B[i, j]
}
"""
HALF_MATMUL = """
op hmm(A: f16[M, K], B: f16[K, N], bias: f32[N]) -> C: f32[M, N] {
    C[i, j] = max(sum[k](f32(A[i, k]) * f32(B[k, j])) + bias[j], 0.0)
}
"""


@pytest.fixture(scope="module", autouse=True)
def gpu():
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _f16(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def _check(op, args) -> None:
    """Run ``op`` on NumPy ``args`` into NaN-poisoned ``out=`` and compare with the reference."""
    bindings = op.bind(args, {}).bindings
    want = reference_results(op.te, list(args), bindings)
    out = [np.full(w.shape, np.nan, w.dtype) for w in want]
    op(*args, out=out[0] if len(out) == 1 else tuple(out))
    for got, expected, name in zip(out, want, op.te.results):
        assert_matches(got, expected, op.te.tensors[name].dtype, f"{name} at {bindings}")


CASES = {
    "axpb": (ELEMENTWISE, lambda rng, n: (_f32(rng, n, n + 2), _f32(rng, n, n + 2))),
    "softmax": (EXAMPLES / "softmax.tc", lambda rng, n: (_f32(rng, n % 37 + 1, n + 3),)),
    "layernorm": (EXAMPLES / "layernorm.tc", lambda rng, n: (_f32(rng, n % 37 + 1, n + 1), _f32(rng, n + 1),
                                                             _f32(rng, n + 1))),
    "matmul": (EXAMPLES / "matmul.tc", lambda rng, n: (_f32(rng, n, n % 70 + 5), _f32(rng, n % 70 + 5, n % 9 + 3))),
    "hmm": (HALF_MATMUL, lambda rng, n: (_f16(rng, n, 64), _f16(rng, 64, n + 1), _f32(rng, n + 1))),
}


@pytest.mark.parametrize("name", CASES)
def test_one_kernel_for_every_size(fresh_cache, rng, name):
    source, make = CASES[name]
    op = tcc.compile(source, target="cuda", dynamic=True)[name]
    for n in SIZES:
        _check(op, make(rng, n))
    assert op.compiles == 1


@pytest.mark.parametrize("name", ["axpb", "softmax", "matmul", "hmm"])
def test_torch_tensors_take_a_plan_per_signature(fresh_cache, rng, name):
    """Two sizes in turn, each call's results written by the kernels into fresh tensors: a plan
    per signature, each with its own symbols' values and grids."""
    torch = pytest.importorskip("torch")
    source, make = CASES[name]
    op = tcc.compile(source, target="cuda", dynamic=True)[name]
    shapes = [make(rng, n) for n in (33, 1000, 7)]
    for args in [*shapes, *shapes, *shapes]:
        dev = [torch.from_numpy(a).cuda() for a in args]
        got = op(*dev)
        got = got if isinstance(got, tuple) else (got,)
        bindings = op.bind(args, {}).bindings
        want = reference_results(op.te, list(args), bindings)
        for g, w, r in zip(got, want, op.te.results):
            assert_matches(g.cpu().numpy(), w, op.te.tensors[r].dtype, f"{r} at {bindings}")
    assert op.compiles == 1 and len(op.plans.plans) >= 3


# benchmarks/dynamic.py's cases (the dynamic axis first), the row length through every range of the
# row kernels' register variants, an f16 GEMM's M through its tensor-core ranges:
# (source, op, dynamic=, inputs for a size, sizes)
RANGE_SIZES = (1, 7, 33, 1000, 4096, 8192, 8193, 2)  # every range of each (8193: past the row variants)
HMM = """op hmm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]))
}"""
RANGED = {
    "softmax": (EXAMPLES / "softmax.tc", "softmax", True, lambda rng, s: (_f32(rng, s, 1000),), RANGE_SIZES),
    "softmax_row": (EXAMPLES / "softmax.tc", "softmax", True, lambda rng, s: (_f32(rng, 3, s),), RANGE_SIZES),
    "layernorm": (EXAMPLES / "layernorm.tc", "layernorm", True,
                  lambda rng, s: (_f32(rng, s, 768), _f32(rng, 768), _f32(rng, 768)), RANGE_SIZES),
    "layernorm_row": (EXAMPLES / "layernorm.tc", "layernorm", True,
                      lambda rng, s: (_f32(rng, 2, s), _f32(rng, s), _f32(rng, s)), RANGE_SIZES),
    "matmul_M": (EXAMPLES / "matmul.tc", "matmul", ("M",), lambda rng, s: (_f32(rng, s, 512), _f32(rng, 512, 512)),
                 RANGE_SIZES),
    "hmm_M": (HMM, "hmm", ("M",), lambda rng, s: (_f16(rng, s, 1024), _f16(rng, 1024, 1024)), (1, 7, 33, 1000, 4097)),
}


@pytest.mark.parametrize("case", RANGED)
def test_kernels_by_range_one_build_every_size(fresh_cache, rng, case):
    """One build serves every size, each call running its range's kernels (tests/test_cuda_dynamic.py
    lists them): NumPy arrays into poisoned ``out=``, then PyTorch tensors (the plans of the fast
    path), poisoned too, one of them misaligned (an aligned variant's fallback)."""
    torch = pytest.importorskip("torch")
    source, name, dynamic, make, sizes = RANGED[case]
    built = tcc.kernels_built()
    op = tcc.compile(source, target="cuda", dynamic=dynamic)[name]
    for s in sizes:
        args = make(rng, s)
        _check(op, args)
        want = reference_results(op.te, list(args), op.bind(args, {}).bindings)[0]
        for offset in (0, 1):  # out= at a 4-byte offset: no kernel may assume it 16-byte aligned
            out = torch.full((want.size + offset,), float("nan"), device="cuda")[offset:].view(want.shape)
            op(*(torch.from_numpy(a).cuda() for a in args), out=out)
            assert_matches(out.cpu().numpy(), want, op.te.tensors[op.te.results[0]].dtype, f"{case} at {s}, +{offset}")
    assert op.compiles == 1 and tcc.kernels_built() == built + 1


@pytest.mark.parametrize("channels, side, filters, sizes", [
    (32, 6, 32, (1, 2, 3, 8, 17, 33, 49)),  # split-K to a batch of 48, one tile a block above
    (32, 28, 64, (1, 2, 3, 8, 9, 17)),  # benchmarks/dynamic.py's conv_N: 32 x 32 tiles to 8, larger above
])
def test_a_convolution_by_the_range_of_its_batch(fresh_cache, rng, channels, side, filters, sizes):
    op = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", dynamic=("N",)).conv2d
    for n in sizes:
        x, w, b = _f32(rng, n, channels, side, side), _f32(rng, filters, channels, 3, 3), _f32(rng, filters)
        bindings = op.bind((x, w, b), {"P": 1}).bindings
        want = reference_results(op.te, [x, w, b], bindings)[0]
        out = np.full(want.shape, np.nan, np.float32)
        op(x, w, b, P=1, out=out)
        assert_matches(out, want, op.te.tensors["Y"].dtype, f"batch {n}")
    assert op.compiles == 1


def test_torch_out_poisoned(fresh_cache, rng):
    torch = pytest.importorskip("torch")
    op = tcc.compile(EXAMPLES / "softmax.tc", target="cuda", dynamic=("N", "C")).softmax
    for n, c in ((1, 1), (7, 33), (1000, 1000), (3, 4096)):
        x = _f32(rng, n, c)
        out = torch.full((n, c), float("nan"), device="cuda")
        op(torch.from_numpy(x).cuda(), out=out)
        assert_matches(out.cpu().numpy(), reference_results(op.te, [x], dict(N=n, C=c))[0], op.te.tensors["Y"].dtype)


def test_an_empty_dim_launches_nothing(fresh_cache, rng):
    op = tcc.compile(ELEMENTWISE, target="cuda", dynamic=True).axpb
    assert op(np.ones((0, 5), np.float32), np.ones((0, 5), np.float32)).shape == (0, 5)
    _check(op, (_f32(rng, 3, 5), _f32(rng, 3, 5)))
    assert op.compiles == 1


def test_dynamic_true_compiles_one_kernel_for_every_size(fresh_cache, rng):
    op = tcc.compile(EXAMPLES / "softmax.tc", target="cuda", dynamic=True).softmax
    for n in (5, 6, 7, 300, 1):
        _check(op, (_f32(rng, n, 11),))
    assert op.compiles == 1


def test_a_dynamic_batch_convolution(fresh_cache, rng):
    op = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", dynamic=("N",)).conv2d
    for n in (1, 7, 33):
        _check(op, (_f32(rng, n, 3, 12, 12), _f32(rng, 8, 3, 3, 3), _f32(rng, 8)))
    assert op.compiles == 1


def test_a_new_process_finds_the_kernel_for_any_size(fresh_cache):
    script = textwrap.dedent(f"""
        import sys, numpy as np, tcc
        op = tcc.compile({ELEMENTWISE!r}, target="cuda", dynamic=True).axpb
        n = int(sys.argv[1])
        a = np.arange(3 * n, dtype=np.float32).reshape(3, n)
        assert np.array_equal(op(a, a), a * 3)
        print(op.compiles, op.loads)
    """)
    env = {**os.environ, "PYTHONPATH": child_pythonpath(ROOT), "TCC_CACHE_DIR": str(fresh_cache)}
    runs = [subprocess.run([sys.executable, "-c", script, str(n)], capture_output=True, text=True, check=True,
                           env=env) for n in (5, 77)]
    assert [r.stdout.split() for r in runs] == [["1", "0"], ["0", "1"]]
