"""A row's elements in registers on CUDA, without a GPU: the row schedule's threads keep the
elements they touch in register arrays (tcc/passes/autoschedule_cuda/row_registers.py), so a
softmax's exponentials need no shared memory and a layernorm reads X once, not three times;
checked by the simulator of scheduled CUDA loop IR (tests/gpu_sim.py) against the CPU."""

from __future__ import annotations

from pathlib import Path

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.ir.expr import Load, walk
from tcc.ir.loops import Allocate, stmt_exprs, walk_stmts

pytest.importorskip("cuda.bindings.nvrtc")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RMSNORM = """op rmsnorm(X: f32[N, D], g: f32[D]) -> Y: f32[N, D] {
    r[n] = rsqrt(sum[d](X[n, d] * X[n, d]) / D + 1e-6)
    Y[n, d] = X[n, d] * r[n] * g[d]
}
"""


def _scheduled(source, name: str, bindings: dict):
    op = tcc.compile(source, target="cuda", arch="sm_90")[name]
    return op.lowered(bindings).scheduled


def _shared(func) -> list[str]:
    return [s.buffer.name for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "shared"]


def _global_reads(func, name: str) -> int:
    return sum(1 for s in walk_stmts(func.body) for e in stmt_exprs(s) for n in walk(e)
               if isinstance(n, Load) and n.buffer == name)


def _cpu(source, name: str, *args):
    return tcc.compile(source)[name](*args)


@pytest.mark.parametrize("N,C", [(1, 64), (3, 1000), (2, 4097)])
def test_softmax_keeps_its_exponentials_in_registers(rng, N, C):
    func = _scheduled(EXAMPLES / "softmax.tc", "softmax", {"N": N, "C": C})
    assert not _shared(func)
    x = rng.standard_normal((N, C)).astype(np.float32)
    arrays = {"X": x, "Y": np.full((N, C), np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["Y"], _cpu(EXAMPLES / "softmax.tc", "softmax", x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("N,D", [(2, 64), (3, 333), (1, 2048)])
def test_layernorm_reads_its_input_once(rng, N, D):
    func = _scheduled(EXAMPLES / "layernorm.tc", "layernorm", {"N": N, "D": D})
    assert _global_reads(func, "X") == 1
    x, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((N, D), (D,), (D,)))
    arrays = {"X": x, "g": g, "b": b, "Y": np.full((N, D), np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["Y"], _cpu(EXAMPLES / "layernorm.tc", "layernorm", x, g, b),
                               rtol=1e-4, atol=1e-5)


def test_rmsnorm_reads_its_input_once(rng):
    func = _scheduled(RMSNORM, "rmsnorm", {"N": 3, "D": 777})
    assert _global_reads(func, "X") == 1
    x, g = rng.standard_normal((3, 777)).astype(np.float32), rng.standard_normal(777).astype(np.float32)
    arrays = {"X": x, "g": g, "Y": np.full((3, 777), np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["Y"], _cpu(RMSNORM, "rmsnorm", x, g), rtol=1e-4, atol=1e-5)


def test_rows_too_long_for_registers_keep_memory(rng):
    """20000 floats a row over 256 threads is 79 values a thread: over the register budget. The
    exponentials (80 KB, over the stack limit) become a global intermediate with a row per block,
    and X is read from global memory by each of the two loops that read it."""
    func = _scheduled(EXAMPLES / "softmax.tc", "softmax", {"N": 1, "C": 20000})
    assert _global_reads(func, "X") == 2 and "e" in {b.name for b in _global_temps(func)}
    x = rng.standard_normal((1, 20000)).astype(np.float32)
    arrays = {"X": x, "Y": np.full(x.shape, np.nan, np.float32)}
    gpu_sim.run(func, arrays)
    np.testing.assert_allclose(arrays["Y"], _cpu(EXAMPLES / "softmax.tc", "softmax", x), rtol=1e-5, atol=1e-9)


def _global_temps(func) -> list:
    return [s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "global"]
