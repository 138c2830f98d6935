"""Recurrences on CUDA without a GPU: the independent axes are bound to blocks and threads, the
sequential axis is a loop inside each thread; checked by the simulator of scheduled CUDA loop IR
(tests/gpu_sim.py) against a Python loop, and compiled by NVRTC."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest
from test_recurrence import LINEAR, linear_loop

import tcc
from tcc.ir.loops import For, is_sequential, walk_stmts
from tcc.runtime import cuda as rt
from tcc.target import CudaTarget

pytest.importorskip("cuda.bindings.nvrtc")

INNER = "op run(X: f32[B, L]) -> Y: f32[B, L] {\n    Y[b, i] = select(i == 0, X[b, i], Y[b, i - 1] + X[b, i])\n}\n"


def _sequential_inside_threads(func) -> bool:
    threads = [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind == "thread.x"]
    inner = [s for t in threads for s in walk_stmts(t.body) if is_sequential(s)]
    return bool(inner) and all(s.kind == "serial" for s in inner) and \
        all(not (isinstance(s, For) and s.kind.startswith(("block", "thread")) and is_sequential(s))
            for s in walk_stmts(func.body))


@pytest.mark.parametrize("T,D", [(1, 1), (7, 33), (33, 7), (1000, 5)])
def test_linear_recurrence_in_the_simulator(rng, T, D):
    op = tcc.compile(LINEAR, target="cuda", arch="sm_90").linear_recurrence
    A = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    X = rng.standard_normal((T, D)).astype(np.float32)
    func = op.lowered({"T": T, "D": D}).scheduled
    assert _sequential_inside_threads(func)
    arrays = {"A": A, "X": X, "H": np.full((T, D), np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["H"], linear_loop(A, X), rtol=1e-4, atol=1e-5)


def test_inner_axis_recurrence_in_the_simulator(rng):
    op = tcc.compile(INNER, target="cuda", arch="sm_90").run
    X = rng.standard_normal((33, 7)).astype(np.float32)
    func = op.lowered({"B": 33, "L": 7}).scheduled
    assert _sequential_inside_threads(func)
    arrays = {"X": X, "Y": np.full(X.shape, np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["Y"], np.cumsum(X.astype(np.float64), axis=1), rtol=1e-5, atol=1e-5)


def test_recurrences_compile_to_cubin():
    cases = ((LINEAR, "linear_recurrence", {"T": 1000, "D": 33}), (INNER, "run", {"B": 7, "L": 1000}))
    for source, name, bindings in cases:
        op = tcc.compile(source, target="cuda", arch="sm_90")[name]
        kernel = rt.load(name, rt.build(op.lowered(bindings).scheduled, CudaTarget.for_arch("sm_90")))
        assert kernel.meta["kernels"] and all(c.startswith(b"\x7fELF") for c in kernel.cubins)
