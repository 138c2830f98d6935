"""``tcc.grad`` of attention: the streaming backward (FlashAttention-2's, derived). DSL.md's
attention and causal attention in f32 and f64 at odd sizes against PyTorch's SDPA autograd, the
variants (key mask, ALiBi, soft cap, cross attention) against the reference interpreter (which
runs the derived program unfused), finite differences through ``tcc.torch`` (gradcheck), a few
training steps, and the lowered program: a sweep and a stream, no buffer of S x L."""

from __future__ import annotations

import dataclasses

import gpu_sim
import numpy as np
import pytest
import torch
from test_attention import ATTENTION, CAUSAL, VARIANTS

import tcc
from tcc.codegen_cuda import cuda_c, nvrtc
from tcc.ir.loops import For, walk_stmts
from tcc.passes.simplify import evaluate_int
from tcc.passes.te.sweeps import CPU_TILE_KEYS, CPU_TILE_ROWS
from tcc.testing import assert_matches, random_args, reference_results

SIZES = [(1, 1, 8), (7, 7, 8), (33, 33, 64), (7, 33, 8), (33, 1, 64)]  # S, L, D


@pytest.fixture(scope="module")
def lib():
    return tcc.compile(ATTENTION + CAUSAL)


def _sdpa_grads(args: list[np.ndarray], dO: np.ndarray, scale: float, causal: bool) -> list[np.ndarray]:
    q, k, v = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    out.backward(torch.tensor(dO, dtype=torch.float64))
    return [t.grad.numpy() for t in (q, k, v)]


def _poisoned(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(np.full(a.shape, np.nan, a.dtype) for a in arrays)


def _no_pairs_stored(op, bindings: dict, S: int, L: int) -> None:
    """The backward swept and the forward streamed, and no buffer the loops allocate holds S x L
    elements (or, at tiny sizes, more than a tile of pairs or of the O-sized row tensors)."""
    lowered = op.lowered(bindings)
    assert lowered.te.sweeps and lowered.te.streams, lowered.te.fusion_notes
    func = lowered.scheduled
    params = {p.name for p in func.params}
    sizes = {name: b.size for name, b in func.buffers().items() if name not in params}
    B, H, D = bindings["B"], bindings["H"], bindings["D"]
    assert max(sizes.values()) <= max(B * H * S * D, 128 * max(D, 128)), sizes
    if S * L > 128 * max(D, 128):
        assert max(sizes.values()) < B * H * S * L, sizes


CASES = [(*size, "f32", causal) for size in SIZES for causal in (False, True) if not causal or size[0] == size[1]] \
    + [(1, 1, 8, "f64", True), (7, 33, 8, "f64", False), (33, 33, 64, "f64", True)]


@pytest.mark.parametrize("S,L,D,T,causal", CASES)
def test_gradients_match_sdpa(lib, rng, S, L, D, T, causal):
    op = (lib.causal_attention if causal else lib.attention).bound(T=T)
    grad = tcc.grad(op)
    dtype = np.float32 if T == "f32" else np.float64
    args = [rng.standard_normal((2, 3, n, D)).astype(dtype) for n in (S, L, L)]
    dO = rng.standard_normal((2, 3, S, D)).astype(dtype)
    scale = 1.0 / np.sqrt(D)
    outs = _poisoned(*args)
    got = grad(*args, np.float32(scale), dO, out=outs)
    for name, g, e in zip(("dQ", "dK", "dV"), got, _sdpa_grads(args, dO, scale, causal)):
        assert g.dtype == dtype and np.isfinite(g).all(), name
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(e).max()), err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_large_sizes_store_no_pairs(lib, rng, causal):
    S, L, D = 200, (200 if causal else 130), 8
    op = (lib.causal_attention if causal else lib.attention).bound(T="f32")
    grad = tcc.grad(op)
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    args = random_args(grad.te, bindings, rng)
    expected = reference_results(grad.te, args, bindings)
    got = grad(*args, out=_poisoned(*expected))
    for name, g, e in zip(grad.te.results, got, expected):
        assert_matches(g, e, grad.te.tensors[name].dtype, name)
    _no_pairs_stored(grad, bindings, S, L)
    (sweep,) = grad.lowered(bindings).te.sweeps  # the causal mask's tiles skipped (checked above: none added)
    assert (sweep.limit is not None) == causal


@pytest.mark.parametrize("S,L,D,causal", [(7, 33, 64, False), (33, 33, 8, True), (1, 1, 8, False)])
def test_half_gradients_sweep(lib, rng, S, L, D, causal):
    """An f16 program's gradients (summed in f32, stored as f16) are swept too: the sums keep f32
    partials and round once as they are stored."""
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T="f16"))
    bindings = {"B": 2, "H": 3, "S": S, "D": D} | ({} if causal else {"L": L})
    args = random_args(grad.te, bindings, rng)
    expected = reference_results(grad.te, args, bindings)
    got = grad(*args, out=_poisoned(*expected))
    for name, g, e in zip(grad.te.results, got, expected):
        assert_matches(g, e, grad.te.tensors[name].dtype, name)
    _no_pairs_stored(grad, bindings, S, L)


@pytest.mark.parametrize("variant,wrt", [("masked", None), ("softcap", None), ("alibi", ["Q", "K", "V"]),
                                         ("alibi", None)])
def test_variants_against_the_reference(rng, variant, wrt):
    """Masks, ALiBi and soft-capping differentiate through the sweep; ALiBi's slope gradient (a sum
    over every pair) stores the scores' gradient anyway, and then nothing is swept (the fused
    stage says why)."""
    op = tcc.compile(VARIANTS[variant])[variant]
    grad = tcc.grad(op, wrt)
    S, L = 33, (33 if variant == "alibi" else 7)
    bindings = {"B": 1, "H": 2, "S": S, "D": 8} | ({} if variant == "alibi" else {"L": L})
    args = random_args(grad.te, bindings, rng)
    if variant == "masked":
        args[3] = (rng.random((1, L)) < 0.6).astype(np.int64)
        args[3][:, 0] = 1
    expected = reference_results(grad.te, args, bindings)
    got = grad(*args, out=_poisoned(*expected))
    got = got if isinstance(got, tuple) else (got,)
    for name, g, e in zip(grad.te.results, got, expected):
        assert_matches(g, e, grad.te.tensors[name].dtype, name)
    lowered = grad.lowered(bindings)
    if wrt is None and variant == "alibi":
        assert not lowered.te.sweeps and any("stored anyway" in n for n in lowered.te.fusion_notes)
    else:
        _no_pairs_stored(grad, bindings, S, L)


def test_the_shift_is_held_constant_only_where_no_result_reads_it():
    """A chain whose result reads the maximum itself keeps the max's rule (its ties counted)."""
    shifted = """
op f(Q: f64[S, D], K: f64[L, D]) -> (Y: f64[S], M: f64[S]) {
    s[i, j] = sum[d](Q[i, d] * K[j, d])
    M[i] = max[j](s[i, j])
    Y[i] = sum[j](exp(s[i, j] - M[i]))
}
"""
    text = tcc.grad_source(tcc.compile(shifted).f)
    assert "M_ties" in text
    text = tcc.grad_source(tcc.compile(ATTENTION).attention)
    assert "ties" not in text


def test_fused_stage_shows_the_sweep(lib):
    grad = tcc.grad(lib.attention.bound(T="f32"))
    args = [np.zeros((1, 2, 65, 8), np.float32)] * 3
    text = grad.lower(*args, np.float32(0.5), args[0], stage="fused")
    assert "sweep over" in text and "never stored" in text and "stream over" in text


F64 = """
op attention64(Q: f64[B, H, S, D], K: f64[B, H, L, D], V: f64[B, H, L, D]) -> O: f64[B, H, S, D] {
    s[b, h, i, j] = sum[d](Q[b, h, i, d] * K[b, h, j, d]) * 0.5
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / l[b, h, i]
}

op causal64(Q: f64[B, H, S, D], K: f64[B, H, S, D], V: f64[B, H, S, D]) -> O: f64[B, H, S, D] {
    s[b, h, i, j] = select(j <= i, sum[d](Q[b, h, i, d] * K[b, h, j, d]) * 0.5, -inf)
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / l[b, h, i]
}
"""


@pytest.fixture(scope="module")
def ops64():
    return tcc.torch.library(F64, namespace="tcc_test_attention_grad")


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_through_tcc_torch(ops64, causal):
    """Finite differences against the derived gradients (one gradient op per input, each streamed)."""
    g = torch.Generator().manual_seed(0)
    S, L = 7, (7 if causal else 5)
    args = tuple(torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (S, L, L))
    assert torch.autograd.gradcheck(ops64.causal64 if causal else ops64.attention64, args)


def test_tcc_torch_attention_trains(ops64):
    """A few steps of gradient descent on Q, K and V: the loss falls, and each step's gradients are
    SDPA's."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    target = torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64)
    losses = []
    for _ in range(5):
        loss = ((ops64.attention64(q, k, v) - target) ** 2).sum()
        grads = torch.autograd.grad(loss, (q, k, v))
        ref = torch.autograd.grad(((torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.5)
                                    - target) ** 2).sum(), (q, k, v))
        for a, b in zip(grads, ref):
            torch.testing.assert_close(a, b)
        with torch.no_grad():
            for t, d in zip((q, k, v), grads):
                t -= 0.05 * d
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("causal", [False, True])
def test_on_the_cuda_simulator(rng, causal):
    """The backward under the generic CUDA schedule: its CUDA C compiles through NVRTC, and the
    simulator runs it to the reference's answer."""
    pytest.importorskip("cuda.bindings.nvrtc")
    lib = tcc.compile(CAUSAL if causal else ATTENTION, target="cuda", arch="sm_90")
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T="f32"))
    S, L, D = 7, (7 if causal else 33), 8
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    lowered = grad.lowered(bindings)
    assert lowered.te.sweeps and lowered.te.streams, lowered.te.fusion_notes
    nvrtc.compile_cubin(cuda_c.generate(lowered.scheduled, grad.target).source, "sm_90")
    args = random_args(grad.te, bindings, rng)
    arrays = {p: a for p, a in zip(grad.te.params, args) if p in grad.te.tensors}
    expected = reference_results(grad.te, args, bindings)
    arrays |= {r: np.full(e.shape, np.nan, e.dtype) for r, e in zip(grad.te.results, expected)}
    gpu_sim.run(lowered.scheduled, arrays, scalars={"scale": args[3]})
    for r, e in zip(grad.te.results, expected):
        assert_matches(arrays[r], e, grad.te.tensors[r].dtype, r)


@pytest.mark.parametrize("causal", [False, True])
def test_saved_forward_leaves_the_backward_alone(lib, rng, causal):
    """``tcc.saving`` returns the row maxima, sums and output; the gradient op that takes them
    (``saved=``) computes no forward statement again, sweeps, and gives SDPA's gradients."""
    op = (lib.causal_attention if causal else lib.attention).bound(T="f32")
    saved = ["m", "l", "O"]
    forward, grad = tcc.saving(op, saved), tcc.grad(op, saved=saved)
    assert grad.te.params[-3:] == saved
    S, L, D = 33, (33 if causal else 7), 8
    args = [rng.standard_normal((1, 2, n, D)).astype(np.float32) for n in (S, L, L)]
    dO = rng.standard_normal((1, 2, S, D)).astype(np.float32)
    out, m, total = forward(*args, np.float32(0.3))
    got = grad(*args, np.float32(0.3), dO, m, total, out, out=_poisoned(*args))
    for name, g, e in zip(("dQ", "dK", "dV"), got, _sdpa_grads(args, dO, 0.3, causal)):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(e).max()), err_msg=name)
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    lowered = grad.lowered(bindings)
    assert lowered.te.sweeps and not lowered.te.streams
    assert {c.tensor for c in grad.te.computes}.isdisjoint({"m", "l", "O", "O_sum"})


def test_saved_names_a_statement(lib):
    with pytest.raises(tcc.TccError, match="no intermediate or result 'lse'"):
        tcc.grad(lib.attention.bound(T="f32"), saved=["lse"])


@pytest.mark.parametrize("causal", [False, True])
def test_split_sweep_for_more_threads_than_heads(rng, causal):
    """Where the heads are fewer than twice the threads, the sums over the rows and over the keys
    run in nests of their own, each parallel over heads x tiles (one loop); the same answer."""
    many = dataclasses.replace(tcc.compile(ATTENTION).attention.bound(T="f32").target, cores=64)
    lib = tcc.compile(CAUSAL if causal else ATTENTION, target=many)
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T="f32"))
    S, L = 200, (200 if causal else 130)
    bindings = {"B": 2, "H": 3, "S": S, "D": 8} | ({} if causal else {"L": L})
    args = random_args(grad.te, bindings, rng)
    expected = reference_results(grad.te, args, bindings)
    got = grad(*args, out=_poisoned(*expected))
    for name, g, e in zip(grad.te.results, got, expected):
        assert_matches(g, e, grad.te.tensors[name].dtype, name)
    lowered = grad.lowered(bindings)
    assert lowered.te.sweeps[0].split
    parallel = [f for f in walk_stmts(lowered.scheduled.body) if isinstance(f, For) and f.kind == "parallel"
                and f.var.name.startswith("pair_tiles")]
    tiles = {-(-L // CPU_TILE_KEYS), -(-S // CPU_TILE_ROWS)}
    assert {evaluate_int(f.extent) for f in parallel} == {2 * 3 * t for t in tiles}
