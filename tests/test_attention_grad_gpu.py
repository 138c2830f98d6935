"""``tcc.grad`` of attention on a CUDA device (skipped without one): the derived backward (a sweep
over tiles of pairs, the forward's stream) under the generic CUDA schedule, in f32 and f64 at odd
sizes, causal and not, and the variants, against the reference with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import ATTENTION, CAUSAL, VARIANTS

import tcc
from tcc.errors import TccError
from tcc.testing import max_relative_error, random_args, reference_results, tolerance

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
