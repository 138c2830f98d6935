"""``tcc.grad`` of attention on a CUDA device (skipped without one): the derived backward (a sweep
over tiles of pairs, the forward's stream) under the generic CUDA schedule, in f32 and f64 at odd
sizes, causal and not, and the variants; in f16 and bf16 at rows of 64 and 128 as FlashAttention-2's
backward on the matrix units (a ``MatrixSweep``); against the reference with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import ATTENTION, CAUSAL, VARIANTS, half_bindings, half_variant

import tcc
from tcc.errors import TccError
from tcc.ir.loops import walk_stmts
from tcc.ir.matrix_loops import MatrixSweep
from tcc.testing import assert_matches, max_relative_error, random_args, reference_results, tolerance

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", autouse=True)
def gpu():
    try:
        if not tcc.cuda.is_available():
            pytest.skip("no CUDA GPU")
    except TccError:
        pytest.skip("no CUDA GPU")


def _check(op, bindings: dict, args: list) -> None:
    lowered = op.lowered(bindings)
    assert lowered.te.sweeps, lowered.te.fusion_notes
    expected = reference_results(op.te, args, bindings)
    outs = tuple(np.full(e.shape, np.nan, e.dtype) for e in expected)
    got = op(*args, out=outs[0] if len(outs) == 1 else outs)
    got = got if isinstance(got, tuple) else (got,)
    for r, g, e in zip(op.te.results, got, expected):  # an f64 op whose chain computes in f32: f32's bound
        err = max_relative_error(np.asarray(g), e)
        assert g.shape == e.shape and err <= tolerance(op.te, r), f"{op.te.name}.{r}: max relative error {err:.3g}"


@pytest.mark.parametrize("S,L,D", [(1, 1, 8), (7, 33, 64), (33, 7, 8), (33, 33, 64), (200, 130, 64)])
@pytest.mark.parametrize("T", ["f32", "f64"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradient_on_the_device(rng, S, L, D, T, causal):
    if causal and S != L:
        pytest.skip("causal attention has one length")
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda")
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T=T))
    bindings = {"B": 2, "H": 3, "S": S, "D": D} | ({} if causal else {"L": L})
    _check(grad, bindings, random_args(grad.te, bindings, rng))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_gradients_on_the_device(rng, variant):
    op = tcc.compile(VARIANTS[variant], target="cuda")[variant]
    grad = tcc.grad(op, ["Q", "K", "V"])
    bindings = {"B": 2, "H": 3, "S": 33, "D": 64} | ({} if variant == "alibi" else {"L": 70})
    args = random_args(grad.te, bindings, rng)
    if variant == "masked":
        args[3] = (rng.random((2, 70)) < 0.6).astype(np.int64)
        args[3][:, 0] = 1
    _check(grad, bindings, args)


@pytest.mark.parametrize("S,L,D", [(1, 1, 64), (7, 33, 128), (33, 7, 64), (33, 33, 128), (33, 1000, 128),
                                   (1000, 1000, 64), (1000, 1, 128)])
@pytest.mark.parametrize("T", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_half_gradients_on_the_matrix_units(rng, S, L, D, T, causal):
    """The sweep of a 16-bit program runs as the FlashAttention-2 backward kernel, its three
    gradients the reference's (which sums the unfused program's products in f32)."""
    if causal and S != L:
        pytest.skip("causal attention has one length")
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda")
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T=T))
    bindings = {"B": 1, "H": 2, "S": S, "D": D} | ({} if causal else {"L": L})
    assert any(isinstance(s, MatrixSweep) for s in walk_stmts(grad.lowered(bindings).scheduled.body))
    _check_half(grad, bindings, rng, T, D)


@pytest.mark.parametrize("wrt", [["Q"], ["K", "V"], ["V"]])
@pytest.mark.parametrize("causal", [False, True])
def test_half_gradients_of_some_inputs(rng, wrt, causal):
    """What tcc.torch derives (one gradient op per input): dQ alone and dK, dV on the matrix
    units; dV alone (its l never stored) under the generic schedule."""
    lib = tcc.compile(ATTENTION + CAUSAL, target="cuda")
    grad = tcc.grad((lib.causal_attention if causal else lib.attention).bound(T="f16"), wrt)
    bindings = {"B": 1, "H": 2, "S": 33, "D": 64} | ({} if causal else {"L": 70})
    swept = any(isinstance(s, MatrixSweep) for s in walk_stmts(grad.lowered(bindings).scheduled.body))
    assert swept == (wrt != ["V"])
    _check_half(grad, bindings, rng, "f16", 64)


@pytest.mark.parametrize("name,wrt,T", [("alibi", ["Q"], "bf16"), ("alibi", ["K"], "f16"), ("grouped", ["Q"], "f16"),
                                        ("lse", None, "bf16")])
def test_half_variant_gradients_on_the_matrix_units(rng, name, wrt, T):
    """ALiBi's bias and causal limit, grouped heads, a row log-sum-exp result: on the same kernel."""
    op = tcc.compile(half_variant(name), target="cuda")[name].bound(T=T)
    grad = tcc.grad(op, wrt)
    bindings = half_bindings(name, 33, 70, 64)
    assert any(isinstance(s, MatrixSweep) for s in walk_stmts(grad.lowered(bindings).scheduled.body))
    _check_half(grad, bindings, rng, T, 64)


def _check_half(grad, bindings: dict, rng, T: str, D: int) -> None:
    """16-bit inputs as torch CUDA tensors (the reference sees the same values in f32), the
    results into poisoned torch tensors."""
    torch = pytest.importorskip("torch")
    te = grad.te
    args = [np.float32(1.0 / np.sqrt(D)) if p == "scale" else a
            for p, a in zip(te.params, random_args(te, bindings, rng))]
    wide = {"f16": torch.float16, "bf16": torch.bfloat16}[T]
    device = [torch.from_numpy(np.ascontiguousarray(a)).cuda().to(wide)
              if p in te.tensors and te.tensors[p].dtype.name == T else a for p, a in zip(te.params, args)]
    rounded = [t.float().cpu().numpy() if isinstance(t, torch.Tensor) else t for t in device]
    expected = reference_results(grad.te, rounded, bindings)
    outs = tuple(torch.full(e.shape, float("nan"), dtype=wide, device="cuda") for e in expected)
    grad(*device, out=outs[0] if len(outs) == 1 else outs)
    for r, g, e in zip(grad.te.results, outs, expected):
        assert_matches(g.float().cpu().numpy(), e, grad.te.tensors[r].dtype, f"{grad.te.name}.{r}")
