"""Schedules size their shared memory by the target (CudaTarget.shared_memory_per_block), not by a
constant: given a smaller budget, the auto-scheduler's GEMM tiles, the user's cache(T, L, shared)
and the CUDA C all keep to it, and the kernels still compute the right numbers (checked by the
CPU simulator of scheduled CUDA loop IR, tests/gpu_sim.py)."""

import gpu_sim
import numpy as np
import pytest

import tcc
from tcc.errors import TccScheduleError
from tcc.ir.loops import Allocate, walk_stmts
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
