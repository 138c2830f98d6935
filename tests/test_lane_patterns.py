"""Vector loads whose lanes are not consecutive elements: an index ``j // 2`` and ``j % 2`` of the
vector variable (two interleaved sources, as Winograd's output transform reads its 2x2 tiles)
and lanes ``stride`` elements apart without a padding guard (its stride-2 tile columns). Each
runs as whole-vector loads and a shuffle; the results must match the reference at odd and
round widths, vector lengths below and above a register. (The schedules vectorise ``j`` as a
whole: left alone, the auto-scheduler splits these rows into ``j // 2`` x ``j % 2`` loops.)"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op

import tcc

INTERLEAVE = """
op interleave(A: f32[N, 2, M]) -> Y: f32[N, 2 * M] {
    Y[i, j] = A[i, j % 2, j // 2] * 2.0
}
schedule interleave cpu {
    vectorize(j)
}
"""
INTERLEAVE_SPREAD = """
op interleave_spread(A: f32[N, 2, M]) -> Y: f32[N, M] {
    Y[i, j] = A[i, j % 2, j // 2 * 2] + A[i, 1 - j % 2, j // 2]
}
schedule interleave_spread cpu {
    vectorize(j)
}
"""
INTERLEAVE_SPLIT = """
op interleave_split(A: f32[N, 2, M], B: f32[N, 2 * M]) -> Y: f32[N, 2 * M] {
    Y[i, j] = A[i, j % 2, j // 2] - B[i, j]
}
schedule interleave_split cpu {
    split(j, 16, jo, ji)
    vectorize(ji)
}
"""
STRIDED = """
op strided(A: f32[N, K]) -> Y: f32[N, (K - 4) // 2 + 1] {
    Y[i, j] = A[i, 2 * j] - 0.5 * A[i, 2 * j + 3]
}
schedule strided cpu {
    split(j, 16, jo, ji)
    vectorize(ji)
}
"""


@pytest.mark.parametrize("m", [1, 7, 14, 16, 31])
def test_interleaved_lanes(m, rng):
    check_op(INTERLEAVE, "interleave", {"N": 3, "M": m}, rng)


@pytest.mark.parametrize("m", [2, 8, 14, 62])
def test_interleaved_lanes_with_a_stride(m, rng):
    check_op(INTERLEAVE_SPREAD, "interleave_spread", {"N": 2, "M": m}, rng)


@pytest.mark.parametrize("m", [8, 15, 31, 100])
def test_interleaved_lanes_of_a_split_row(m, rng):
    """``j = 16 * jo + ji`` (and ``16 * jo + 16 + ji`` in the tail): ``j % 2`` is still ``ji % 2``."""
    check_op(INTERLEAVE_SPLIT, "interleave_split", {"N": 3, "M": m}, rng)
    op = tcc.compile(INTERLEAVE_SPLIT)["interleave_split"]
    text = op.lower(np.zeros((3, 2, m), np.float32), np.zeros((3, 2 * m), np.float32), stage="llvm")
    assert "insertelement" not in text


@pytest.mark.parametrize("k", [4, 9, 29, 31, 64, 1001])
def test_strided_lanes(k, rng):
    check_op(STRIDED, "strided", {"N": 5, "K": k}, rng)


def test_interleaved_lanes_load_whole_vectors():
    """The vector body loads halves and shuffles them together, not one lane at a time."""
    op = tcc.compile(INTERLEAVE)["interleave"]
    text = op.lower(np.zeros((3, 2, 14), np.float32), stage="llvm")
    assert "shufflevector <14 x float>" in text
    assert "insertelement" not in text


def test_strided_lanes_load_whole_vectors():
    op = tcc.compile(STRIDED)["strided"]
    text = op.lower(np.zeros((2, 31), np.float32), stage="llvm")
    assert "load <27 x float>" in text  # 14 lanes 2 apart: from the first lane's element to the last's
    assert "insertelement" not in text
