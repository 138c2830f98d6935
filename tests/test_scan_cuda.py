"""Prefix scans on CUDA without a GPU: a recurrence ``P[.., i] = P[.., i - 1] (op) term`` along
the rows of a tensor becomes one block per row that scans the row chunk by chunk
(tcc/passes/autoschedule_cuda/scan.py); checked by the simulator of scheduled CUDA loop IR
(tests/gpu_sim.py) against NumPy at odd lengths, and compiled by NVRTC for every operator and
dtype."""

from __future__ import annotations

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccError
from tcc.ir.loops import BlockScan, walk_stmts
from tcc.runtime import cuda as rt
from tcc.target import CudaTarget

pytest.importorskip("cuda.bindings.nvrtc")


def scan_op(reduction: str, dtype: str = "f32", extent: str = "i + 1"):
    source = (f"op scan(X: {dtype}[B, L]) -> Y: {dtype}[B, L] {{\n"
              f"    Y[b, i] = {reduction}[j: {extent}](X[b, j])\n}}\n")
    return tcc.compile(source, target="cuda", arch="sm_90").scan


def block_scans(func) -> list[BlockScan]:
    return [s for s in walk_stmts(func.body) if isinstance(s, BlockScan)]


def simulate(op, x: np.ndarray) -> np.ndarray:
    func = op.lowered({"B": x.shape[0], "L": x.shape[1]}).scheduled
    assert len(block_scans(func)) == 1  # one block per row scanning it, not a thread walking it
    poison = np.nan if x.dtype.kind == "f" else -12345
    arrays = {"X": x, "Y": np.full(x.shape, poison, x.dtype)}
    gpu_sim.run(func, arrays)
    return arrays["Y"]


@pytest.mark.parametrize("B,L", [(1, 32), (3, 33), (2, 1000), (1, 2100)])
def test_cumsum_is_a_block_scan(rng, B, L):
    x = rng.standard_normal((B, L)).astype(np.float32)
    np.testing.assert_allclose(simulate(scan_op("sum"), x), np.cumsum(x.astype(np.float64), axis=1),
                               rtol=1e-4, atol=1e-4)


def test_integer_cumsum_is_exact(rng):
    x = rng.integers(-1000, 1000, (2, 777)).astype(np.int32)
    np.testing.assert_array_equal(simulate(scan_op("sum", "i32"), x), np.cumsum(x, axis=1, dtype=np.int32))


@pytest.mark.parametrize("reduction,numpy", [("max", np.maximum), ("min", np.minimum)])
def test_running_max_and_min(rng, reduction, numpy):
    x = rng.standard_normal((3, 301)).astype(np.float32)
    np.testing.assert_array_equal(simulate(scan_op(reduction), x), numpy.accumulate(x, axis=1))


def test_running_product(rng):
    x = rng.uniform(0.9, 1.1, (2, 333)).astype(np.float32)
    np.testing.assert_allclose(simulate(scan_op("prod"), x), np.cumprod(x.astype(np.float64), axis=1), rtol=1e-4)


def test_exclusive_prefix_sum(rng):
    """``sum[j: i]``: the first element is the identity, the scans pass writes it ``select(i <= 0, 0, ...)``."""
    x = rng.standard_normal((2, 300)).astype(np.float32)
    want = np.concatenate([np.zeros((2, 1)), np.cumsum(x.astype(np.float64), axis=1)[:, :-1]], axis=1)
    np.testing.assert_allclose(simulate(scan_op("sum", extent="i"), x), want, rtol=1e-4, atol=1e-4)


def test_short_rows_and_linear_recurrences_keep_a_thread_per_row():
    """Rows shorter than a warp, and a recurrence whose step multiplies the previous value (not a
    plain scan of terms), stay one thread walking each row."""
    assert not block_scans(scan_op("sum").lowered({"B": 64, "L": 7}).scheduled)
    linear = ("op lin(A: f32[B, L], X: f32[B, L]) -> H: f32[B, L] {\n"
              "    H[b, t] = select(t == 0, X[b, t], A[b, t] * H[b, t - 1] + X[b, t])\n}\n")
    op = tcc.compile(linear, target="cuda", arch="sm_90").lin
    assert not block_scans(op.lowered({"B": 4, "L": 1000}).scheduled)


@pytest.mark.parametrize("reduction,dtype", [("sum", "f32"), ("sum", "f64"), ("sum", "i64"), ("max", "i32"),
                                             ("min", "f16"), ("prod", "bf16")])
def test_block_scans_compile_to_cubin(reduction, dtype):
    func = scan_op(reduction, dtype).lowered({"B": 3, "L": 5000}).scheduled
    assert block_scans(func)
    kernel = rt.load("scan", rt.build(func, CudaTarget.for_arch("sm_90")))
    assert kernel.meta["kernels"] and all(c.startswith(b"\x7fELF") for c in kernel.cubins)


@pytest.mark.cuda
@pytest.mark.parametrize("B,L", [(1, 1), (7, 33), (3, 1000), (2, 65536 + 7)])
@pytest.mark.parametrize("reduction,numpy", [("sum", np.cumsum), ("max", np.maximum.accumulate)])
def test_block_scans_on_the_gpu(rng, B, L, reduction, numpy):
    try:
        available = tcc.cuda.is_available()
    except TccError:
        available = False
    if not available:
        pytest.skip("no CUDA GPU")
    x = rng.standard_normal((B, L)).astype(np.float32)
    out = np.full((B, L), np.nan, np.float32)
    scan_op(reduction)(x, out=out)
    want = numpy(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(L))
