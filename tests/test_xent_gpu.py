"""The fused linear cross-entropy on a CUDA device (skipped without one): the generic op of
benchmarks/xent.py in f32, f16 and bf16 (f32 math) at odd sizes, and the CPU's spelling in f32,
against the reference with poisoned outputs; the labels' index check holds on the device."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import XENT
from test_attention_gpu import _check, gpu  # noqa: F401 (the fixture that skips without a GPU)
from test_xent import GENERIC

import tcc

pytestmark = pytest.mark.cuda

SIZES = [(1, 8, 1), (7, 33, 70), (33, 769, 1000), (1000, 16, 1001), (130, 256, 1025)]  # (the reference runs unfused)


def _args(rng, N: int, K: int, C: int) -> list[np.ndarray]:
    return [rng.standard_normal((N, K)).astype(np.float32), rng.standard_normal((C, K)).astype(np.float32),
            rng.integers(0, C, N).astype(np.int64)]


@pytest.mark.parametrize("N,K,C", SIZES)
@pytest.mark.parametrize("T", ["f32", "f16", "bf16"])
def test_linear_cross_entropy_on_the_device(rng, N, K, C, T):
    op = tcc.compile(GENERIC, target="cuda").linear_xent.bound(T=T)
    args = _args(rng, N, K, C)
    if T == "f16":
        args[:2] = [a.astype(np.float16) for a in args[:2]]
    _check(op, {"N": N, "K": K, "C": C}, args)


@pytest.mark.parametrize("N,K,C", SIZES[1:3])
def test_the_f32_spelling_on_the_device(rng, N, K, C):
    op = tcc.compile(XENT, target="cuda").linear_xent
    _check(op, {"N": N, "K": K, "C": C}, _args(rng, N, K, C))


def test_a_label_out_of_range_on_the_device(rng):
    op = tcc.compile(XENT, target="cuda").linear_xent
    X, W, _ = _args(rng, 7, 8, 70)
    with pytest.raises(tcc.TccError):
        op(X, W, np.full(7, 70, np.int64))
