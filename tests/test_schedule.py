"""Schedule primitives and the auto-scheduler against the reference, at odd and round sizes."""

from dataclasses import replace

import numpy as np
import pytest

import tcc
from tcc.errors import TccScheduleError
from tcc.passes import pipeline
from tcc.passes.loops.schedule import Step
from tcc.runtime import cpu
from tcc.testing import assert_matches, random_args, reference_results

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }"
SOFTMAX = """op softmax(X: f32[N, C]) -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}"""


@pytest.fixture(autouse=True)
def _own_cache(fresh_cache):
    """The tests replace the backend's schedule step: a kernel another test (or an xdist worker
    sharing the disk cache) built without it must not be found."""
    yield


def _run(src, name, bindings, rng, steps=None, monkeypatch=None):
    if steps is not None:
        scheduled = replace(cpu.BACKEND, schedule=lambda f, t, *a, **k: pipeline.cpu_schedule(f, t, tuple(steps)))
        monkeypatch.setattr(cpu, "BACKEND", scheduled)
    op = tcc.compile(src)[name]
    args = random_args(op.te, bindings, rng)
    expected = reference_results(op.te, args, bindings)
    out = np.full(expected[0].shape, np.nan, expected[0].dtype)
    op(*args, out=out)
    assert_matches(out, expected[0], op.te.tensors[op.te.results[0]].dtype, name)
    return op


def S(text):  # noqa: N802 - reads like the schedule language
    words = [int(w) if w.isdigit() else w for w in text.replace(",", " ").split()]
    if "->" in words:
        k = words.index("->")
        return Step(str(words[0]), tuple(words[1:k]), tuple(map(str, words[k + 1:])))
    return Step(str(words[0]), tuple(words[1:]))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (33, 7, 100), (64, 32, 48), (130, 70, 97)])
def test_autoscheduled_matmul(m, k, n, rng):
    _run(MATMUL, "matmul", dict(M=m, K=k, N=n), rng)


@pytest.mark.parametrize("steps", [
    ["split i by 4", "vectorize j by 8", "unroll i_i"],
    ["decompose C", "split i by 3 -> io, ii", "split j by 16 -> jo, ji", "reorder io, jo, k, ii, ji",
     "unroll ii", "vectorize ji", "parallel io"],
    ["decompose C", "tile i, j by 8, 16", "cache B at i_o", "cache A at j_o", "vectorize j_i"],
    ["decompose C", "split i by 5 -> io, ii", "split j by 8 -> jo, ji", "reorder io, jo, k, ii, ji",
     "cache C at jo", "cache B at jo", "unroll ii", "vectorize ji"],
    ["fuse i, j -> ij", "parallel ij"],
])
@pytest.mark.parametrize("m,k,n", [(7, 33, 5), (33, 16, 40)])
def test_user_schedules_matmul(steps, m, k, n, rng, monkeypatch):
    _run(MATMUL, "matmul", dict(M=m, K=k, N=n), rng, [S(s) for s in steps], monkeypatch)


@pytest.mark.parametrize("n,c", [(1, 1), (7, 33), (4, 1000), (64, 64)])
def test_autoscheduled_softmax(n, c, rng):
    _run(SOFTMAX, "softmax", dict(N=n, C=c), rng)


@pytest.mark.parametrize("bad,match", [
    ("split q by 4", "no loop 'q'"),
    ("reorder j, i, k", "not perfectly nested"),
    ("parallel k", "reduction|same elements"),
    ("vectorize i by 0", "positive"),
    ("frobnicate i", "unknown schedule primitive"),
    ("cache Z at i", "no tensor"),
])
def test_schedule_errors(bad, match, rng, monkeypatch):
    with pytest.raises(TccScheduleError, match=match):
        _run(MATMUL, "matmul", dict(M=7, K=5, N=3), rng, [S(bad)], monkeypatch)


def test_reorder_of_reductions_is_refused(rng, monkeypatch):
    steps = [S("decompose C"), S("split k by 2 -> ko, ki"), S("reorder i, j, ki, ko")]
    with pytest.raises(TccScheduleError, match="reduction"):
        _run(MATMUL, "matmul", dict(M=3, K=6, N=3), rng, steps, monkeypatch)


def test_scheduled_stage_shows_kinds():
    op = tcc.compile(MATMUL).matmul
    a = np.zeros((64, 64), np.float32)
    text = op.lower(a, a, stage="scheduled")
    assert "# vector" in text and "# unroll" in text and "# parallel" in text


def test_compute_at_moves_the_producer_into_the_consumer_loop(rng):
    """compute_at keeps every statement (it once dropped the producer) and folds its storage."""
    from tcc import dtypes
    from tcc.ir.expr import Binary, Const, Load, Var
    from tcc.ir.loops import Allocate, Buffer, For, LoopFunc, Seq, Store, format_func
    from tcc.passes.loops.compute_at import compute_at
    from tcc.runtime import cpu

    f32, i64 = dtypes.f32, dtypes.i64
    a, b, t = Buffer("A", f32, (5,)), Buffer("B", f32, (5, 3)), Buffer("T", f32, (5,))
    i, i2, j = Var("i", i64), Var("i2", i64), Var("j", i64)
    produce = For(i, Const(5, i64), Store("T", (i,), Binary("mul", Load("A", (i,), f32), Const(2.0, f32), f32)))
    consume = For(i2, Const(5, i64), For(j, Const(3, i64), Store("B", (i2, j), Binary(
        "add", Load("T", (i2,), f32), Const(1.0, f32), f32))))
    func = LoopFunc("f", [a, b], Allocate(t, Seq((produce, consume))))
    out = compute_at(func, "T", "i2")
    text = format_func(out)
    assert text.count("for i2 in 0..5") == 1 and "for i in" not in text
    assert "T[] = A[i2] * f32(2.0)" in text and "allocate T: f32[] in local" in text
    kernel = cpu.load(out.name, cpu.build(out))
    x = rng.standard_normal(5).astype(np.float32)
    y = np.full((5, 3), np.nan, np.float32)
    kernel({"A": x, "B": y})
    np.testing.assert_array_equal(y, np.repeat((x * 2 + 1)[:, None], 3, axis=1))


ADD = "op add(A: f32[M, N], B: f32[M, N]) -> C: f32[M, N] { C[i, j] = A[i, j] * B[i, j] + 1.0 }"


@pytest.mark.parametrize("first", ["vectorize i", "vectorize j", "parallel i", "unroll j"])
def test_fuse_refuses_a_loop_already_vectorized_or_parallel(first, rng, monkeypatch):
    """Fused after ``vectorize i``, a 7 x 3 nest was one vector of 21 lanes (fuzz seed 103813
    with one random schedule: a vector of 4096 lanes, which LLVM took minutes to lower); fused
    after ``parallel``, iterations never checked to be independent would run in parallel."""
    with pytest.raises(TccScheduleError, match="fuse i and j first"):
        _run(ADD, "add", dict(M=7, N=3), rng, [S(first), S("fuse i, j")], monkeypatch)


def test_fuse_then_vectorize_runs(rng, monkeypatch):
    _run(ADD, "add", dict(M=7, N=3), rng, [S("fuse i, j -> ij"), S("vectorize ij by 21")], monkeypatch)
