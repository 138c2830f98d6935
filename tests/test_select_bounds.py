"""Reads under ``select`` are proved under its condition (DSL.md's rotate-half RoPE), checked
against NumPy and the reference at odd sizes, and reads the condition does not protect are still
bounds errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op
from test_dsl_contract import step11_ops

import tcc
from tcc.errors import TccBoundsError

ROPE = """
op rope[H = 32](X: f32[N, 2 * H], C: f32[N, 2 * H], S: f32[N, 2 * H]) -> Y: f32[N, 2 * H] {
    Y[n, d] = X[n, d] * C[n, d] + select(d < H, -X[n, d + H], X[n, d - H]) * S[n, d]
}
"""


def rope_numpy(X, C, S, H):
    rotated = np.concatenate([-X[:, H:], X[:, :H]], axis=1)
    return X * C + rotated * S


@pytest.mark.parametrize("N,H", [(1, 32), (7, 1), (33, 5), (1000, 32)])
def test_rope_as_written(rng, N, H):
    source = step11_ops().get("rope", ROPE)
    check_op(source, "rope", {"N": N, "H": H}, rng)  # against the reference
    X, C, S = (rng.standard_normal((N, 2 * H)).astype(np.float32) for _ in range(3))
    got = tcc.compile(source).rope(X, C, S, H=H)
    np.testing.assert_allclose(got, rope_numpy(X, C, S, H), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cond,branches", [
    ("d < H + 1", "X[n, d + H], X[n, d - H]"),  # d = H reads X[n, 2H]
    ("d >= H", "X[n, d + H], X[n, d - H]"),  # the branches swapped: both leave X
    ("d < H or n > 0", "X[n, d + H], X[n, d]"),  # an or proves nothing for its true side
])
def test_unprotected_reads_are_bounds_errors(cond, branches):
    source = f"op f[H = 4](X: f32[N, 2 * H]) -> Y: f32[N, 2 * H] {{\n    Y[n, d] = select({cond}, {branches})\n}}"
    with pytest.raises(TccBoundsError):
        tcc.compile(source).f(np.ones((3, 8), np.float32))


@pytest.mark.parametrize("n", [1, 7, 33])
def test_nested_and_negated_conditions(rng, n):
    source = """
op f(X: f32[N]) -> Y: f32[N] {
    Y[i] = select(i > 0 and not (i >= N - 1), X[i - 1] + X[i + 1], select(i == 0, X[i], X[i - 1]))
}
"""
    check_op(source, "f", {"N": n}, rng)


def test_a_branch_never_taken_is_not_proved(rng):
    """``select(i < 0, X[i - 5], X[i])``: no index satisfies the condition, nothing is read there."""
    source = "op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = select(i < 0, X[i - 5], X[i])\n}"
    check_op(source, "f", {"N": 7}, rng)


@pytest.mark.parametrize("n", [1, 7, 33])
def test_conditions_on_an_offset_variable(rng, n):
    """``t - 1 >= 0`` narrows ``t`` as ``t >= 1`` does; reflect padding written with offsets."""
    source = """
op f(X: f32[N]) -> Y: f32[N + 4] {
    Y[i] = select(i - 2 < 0, X[2 - i], select(i - 2 > N - 1, X[2 * (N - 1) - (i - 2)], X[i - 2]))
}
"""
    if n >= 3:
        check_op(source, "f", {"N": n}, rng)
    check_op("op g(X: f32[N]) -> Y: f32[N] {\n    Y[t] = select(t - 1 >= 0, X[t - 1], 0.0)\n}", "g", {"N": n}, rng)
