"""The fused linear cross-entropy (a language model's loss over a large vocabulary, the logits
never stored): on the CPU, where the vocabulary's weights fill no cache, the stream walks them a
tile at a time outside the rows, in parts for the threads, whose partial maxima and sums per row
are combined at the end. Checked against the reference (the unfused program) on random data at
odd sizes with poisoned outputs, on the host's vectors and on a generic AVX2-width target, with
targets whose small L2 puts test-sized vocabularies in that order."""

from __future__ import annotations

from dataclasses import replace

import gpu_sim
import numpy as np
import pytest
from test_attention import XENT

import tcc
from tcc.codegen_cuda import cuda_c, nvrtc
from tcc.ir.loops import For, walk_stmts
from tcc.runtime.backend import backend_for
from tcc.target import CpuTarget
from tcc.testing import assert_matches, reference_results

GENERIC = """
op linear_xent[T: float](X: T[N, K], W: T[C, K], lab: i64[N]) -> loss: f32[N] {
    z[n, c] = sum[k](f32(X[n, k]) * f32(W[c, k]))
    m[n] = max[c](z[n, c])
    lse[n] = m[n] + log(sum[c](exp(z[n, c] - m[n])))
    loss[n] = lse[n] - z[n, lab[n]]
}
"""
SMALL_CACHES = ((1, 4 << 10), (2, 8 << 10), (3, 64 << 10))  # 8 KiB of L2: a few thousand weights fill it


def host_with_small_caches() -> CpuTarget:
    """This machine's vectors, two cores, and caches that small vocabularies fill."""
    return replace(backend_for("cpu").resolve(None, {}), cores=2, caches=SMALL_CACHES)


def _args(rng, N: int, K: int, C: int, dtype=np.float32, scale: float = 1.0) -> list[np.ndarray]:
    X = (rng.standard_normal((N, K)) * scale).astype(dtype)
    W = rng.standard_normal((C, K)).astype(dtype)
    return [X, W, rng.integers(0, C, N).astype(np.int64)]


def _check(op, bindings: dict, args: list) -> np.ndarray:
    (expected,) = reference_results(op.te, args, bindings)
    out = np.full(expected.shape, np.nan, np.float32)
    op(*args, out=out)
    assert_matches(out, expected, op.te.tensors["loss"].dtype, "loss")
    return out


def _parts(op, bindings: dict) -> int:
    """The stream's parts of the keys (0: tiles inside the blocks of rows); and no buffer of the
    scheduled loops is larger than the parts' rows or a tile of weights (never N x C)."""
    lowered = op.lowered(bindings)
    (stream,) = lowered.te.streams
    func = lowered.scheduled
    params = {p.name for p in func.params}
    N, K = bindings["N"], bindings["K"]
    most = max(stream.splits * (N + stream.tile_rows), K * stream.tile, stream.tile_rows * stream.tile, N)
    assert all(b.size <= most for name, b in func.buffers().items() if name not in params)
    return stream.splits


@pytest.mark.parametrize("N,K,C", [(1, 33, 1000), (7, 33, 70), (13, 8, 1001), (33, 70, 333), (1000, 7, 1000)])
@pytest.mark.parametrize("target", ["host", "avx2-width"])
def test_keys_outside_the_rows(rng, N, K, C, target):
    """The vocabulary in parts (one part and many, ragged tiles of keys, ragged blocks of rows),
    each part's maxima and sums combined into the right loss."""
    machine = host_with_small_caches() if target == "host" else CpuTarget(cores=3, caches=SMALL_CACHES)
    op = tcc.compile(XENT, target=machine).linear_xent
    bindings = {"N": N, "K": K, "C": C}
    _check(op, bindings, _args(rng, N, K, C))
    assert _parts(op, bindings) >= 1
    kinds = {s.kind for s in walk_stmts(op.lowered(bindings).scheduled.body) if isinstance(s, For)}
    assert "parallel" in kinds


def test_parts_combine_far_apart_maxima(rng):
    """Large logits (rows whose maxima differ by hundreds between parts): each part's sums are
    rescaled to the row's maximum without overflow."""
    op = tcc.compile(XENT, target=host_with_small_caches()).linear_xent
    bindings = {"N": 29, "K": 16, "C": 777}
    args = _args(rng, 29, 16, 777, scale=30.0)
    out = _check(op, bindings, args)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("T", ["f16", "f64"])
def test_other_input_dtypes_with_f32_math(rng, T):
    op = tcc.compile(GENERIC, target=host_with_small_caches()).linear_xent.bound(T=T)
    bindings = {"N": 19, "K": 24, "C": 500}
    _check(op, bindings, _args(rng, 19, 24, 500, np.float16 if T == "f16" else np.float64))
    assert _parts(op, bindings) >= 1


def test_a_vocabulary_in_cache_keeps_the_rows_outside(rng):
    """Weights that fit L2 (and every attention) keep blocks of rows outside the tiles of keys."""
    op = tcc.compile(XENT).linear_xent
    bindings = {"N": 33, "K": 8, "C": 100}
    _check(op, bindings, _args(rng, 33, 8, 100))
    assert _parts(op, bindings) == 0


@pytest.mark.parametrize("T,K,C", [("bf16", 768, 32000), ("f16", 4096, 128000), ("f32", 768, 32000)])
def test_benchmark_shapes_compile_for_cuda(T, K, C):
    """benchmarks/xent.py's GPU workloads: their CUDA C compiles for sm_90 (and the simulator
    runs the same schedule at small sizes in test_attention.py)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(GENERIC, target="cuda", arch="sm_90").linear_xent.bound(T=T)
    lowered = op.lowered({"N": 4096, "K": K, "C": C})
    assert lowered.te.streams
    program = cuda_c.generate(lowered.scheduled, op.target)
    nvrtc.compile_cubin(program.source, "sm_90a" if program.arch_specific else "sm_90")


@pytest.mark.parametrize("N,K,C", [(7, 8, 333), (33, 16, 1000), (1, 5, 70)])
def test_keys_in_parts_on_the_cuda_simulator(rng, N, K, C):
    """On the GPU the keys come in parts (a thread per row of each part: more blocks than rows
    alone make), a second kernel combining them: its CUDA C compiles, and the simulator runs the
    schedule to the reference's answer."""
    pytest.importorskip("cuda.bindings.nvrtc")
    op = tcc.compile(XENT, target="cuda", arch="sm_90").linear_xent
    bindings = {"N": N, "K": K, "C": C}
    lowered = op.lowered(bindings)
    (stream,) = lowered.te.streams
    assert stream.splits > 1 and not stream.keys_outside
    nvrtc.compile_cubin(cuda_c.generate(lowered.scheduled, op.target).source, "sm_90")
    args = _args(rng, N, K, C)
    (expected,) = reference_results(op.te, args, bindings)
    arrays = {"X": args[0], "W": args[1], "lab": args[2], "loss": np.full(N, np.nan, np.float32)}
    gpu_sim.run(lowered.scheduled, arrays)
    assert_matches(arrays["loss"], expected, op.te.tensors["loss"].dtype, "loss")


def test_gradient_against_torch(rng):
    """``tcc.grad`` of the fused loss (X and W; the labels are indices) against torch's autograd
    of ``F.cross_entropy(X @ W.T)``, on the target that puts the forward's keys outside the rows."""
    torch = pytest.importorskip("torch")
    op = tcc.compile(XENT, target=host_with_small_caches()).linear_xent
    grad = tcc.grad(op, ["X", "W"])
    X, W, lab = _args(rng, 13, 24, 700)
    dloss = rng.standard_normal(13).astype(np.float32)
    got = grad(X, W, lab, dloss, out=(np.full(X.shape, np.nan, np.float32), np.full(W.shape, np.nan, np.float32)))
    x, w = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (X, W))
    loss = torch.nn.functional.cross_entropy(x @ w.T, torch.from_numpy(lab), reduction="none")
    expected = torch.autograd.grad(loss, (x, w), torch.from_numpy(dloss.astype(np.float64)))
    for name, g, e in zip(("dX", "dW"), got, expected):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-4, atol=1e-4 * float(e.abs().max()), err_msg=name)
