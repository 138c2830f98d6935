"""Work on constant parameters done once (passes/loops/hoist_constants.py, runtime/prepared.py):
``constant_params=`` moves the packing of a GEMM's constant operand out of the kernel into a
prepare function whose buffers the runtime keeps per set of constant arrays."""

import gc
from dataclasses import replace

import numpy as np
import pytest

import tcc
from tcc import dtypes
from tcc.errors import TccArgumentError
from tcc.ir.expr import Binary, Const, Load, Var
from tcc.ir.loopnest import loads
from tcc.ir.loops import Allocate, Buffer, For, LoopFunc, Seq, Store, walk_stmts
from tcc.passes.loops.hoist_constants import hoist_constants
from tcc.passes.te.fusion import GEMM_MIN_FLOPS
from tcc.testing import assert_matches, random_args, reference_results

CONV = """
op conv[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW], b: f32[F])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = max(sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s]) + b[f], 0.0)
}
"""
LINEAR = """
op linear(X: f32[M, K], Wt: f32[N, K], b: f32[N]) -> Y: f32[M, N] {
    Y[i, j] = sum[k](X[i, k] * Wt[j, k]) + b[j]
}
op left(Wt: f32[M, K], X: f32[K, N]) -> Y: f32[M, N] {
    Y[i, j] = sum[k](Wt[i, k] * X[k, j])
}
"""


def _run(op, args, cparams=None):
    """``op`` on ``args`` into a NaN-poisoned output, checked against the reference."""
    cparams = cparams or {}
    bindings = {**op.te.cparams, **cparams, **op.bindings_for(tuple(args), cparams)}
    expected = reference_results(op.te, args, bindings)[0]
    out = np.full(expected.shape, np.nan, np.float32)
    op(*args, out=out, **cparams)
    assert_matches(out, expected, dtypes.f32, op.name)
    got = op(*args, **cparams)  # the plan's path, allocating its result
    assert_matches(got, expected, dtypes.f32, op.name)


def _prepared(op, args, cparams=None) -> LoopFunc | None:
    cparams = cparams or {}
    return op.lowered(op.bindings_for(tuple(args), cparams)).scheduled.attrs.get("prepare")


@pytest.mark.parametrize("n, c, f, hw, k, s", [(1, 7, 33, (9, 7), 3, 1), (3, 16, 64, (7, 7), 3, 1),
                                               (2, 3, 37, (33, 17), 7, 2), (1, 64, 96, (14, 14), 1, 2)])
def test_convolutions_with_constant_weights(rng, n, c, f, hw, k, s):
    op = tcc.compile(CONV, constant_params=["Wt", "b"]).conv
    cparams = {"S": s, "P": k // 2}
    sets = [random_args(op.te, {**op.te.cparams, **cparams, "N": n, "C": c, "F": f, "H": hw[0], "W": hw[1],
                                "KH": k, "KW": k}, rng) for _ in range(2)]
    prepare = _prepared(op, sets[0], cparams)
    assert prepare is not None, "the weight pack was not hoisted"
    for args in [*sets, sets[0], [sets[1][0], *sets[0][1:]]]:  # two layers' weights, alternating, new data
        _run(op, args, cparams)


def test_the_kernel_no_longer_reads_the_weights_it_packs(rng):
    op = tcc.compile(CONV, constant_params=["Wt", "b"]).conv
    args = random_args(op.te, {**op.te.cparams, "N": 1, "C": 64, "F": 64, "H": 9, "W": 9, "KH": 3, "KW": 3}, rng)
    scheduled = op.lowered(op.bindings_for(tuple(args), {})).scheduled
    assert "Wt" not in {ld.buffer for ld in loads(scheduled.body)}
    assert "Wt" in {ld.buffer for ld in loads(scheduled.attrs["prepare"].body)}  # type: ignore[union-attr]
    plain = tcc.compile(CONV).conv.lowered(op.bindings_for(tuple(args), {})).scheduled
    assert "prepare" not in plain.attrs and "Wt" in {ld.buffer for ld in loads(plain.body)}


@pytest.mark.parametrize("m, k, n", [(1, 33, 7), (7, 256, 1000), (128, 96, 33)])
def test_constant_operands_of_matrix_products(rng, m, k, n):
    lib = tcc.compile(LINEAR, constant_params=["Wt", "b"])
    args = random_args(lib.linear.te, {"M": m, "K": k, "N": n}, rng)
    _run(lib.linear, args)
    args = random_args(lib.left.te, {"M": n, "K": k, "N": m}, rng)
    _run(lib.left, args)


CLASSIFIER = """
op classifier(X: f32[1, K, 1, 1], Wt: f32[N, K], b: f32[N]) -> Y: f32[1, N] {
    Y[i, j] = sum[k](X[0, k, 0, 0] * Wt[j, k]) + b[j]
}
op matvec(x: f32[K], Wt: f32[N, K]) -> Y: f32[1, N] {
    Y[i, j] = sum[k](x[k] * Wt[j, k])
}
op activated(X: f32[1, K], Wt: f32[N, K], b: f32[N]) -> Y: f32[1, N] {
    T: f32[1, N]
    T[i, j] = sum[k](X[0, k] * Wt[j, k]) + b[j]
    Y[i, j] = T[i, j] * tanh(T[i, j]) + exp(-T[i, j])
}
"""


@pytest.mark.parametrize("k, n", [(1, 7), (33, 7), (512, 1000), (513, 33), (64, 1025)])
def test_a_single_row_is_a_matrix_product_with_packed_weights(rng, k, n):
    """A classifier at batch 1 reads a row that its result's unit row axis does not index (ONNX
    writes ``t[0, k, 0, 0]``): the GEMM schedule takes it as a product of one row, so its weights
    are packed once into panels read a vector at a time (not gathered a lane at a time), also
    where fusion groups it with an epilogue it does not inline (``activated``)."""
    lib = tcc.compile(CLASSIFIER, constant_params=["Wt", "b"])
    for op in (lib.classifier, lib.matvec, lib.activated):
        args = random_args(op.te, {"K": k, "N": n}, rng)
        _run(op, args)
        assert (_prepared(op, args) is not None) == (2 * k * n >= GEMM_MIN_FLOPS), "the weights were not packed"


def test_prepared_buffers_go_with_their_arrays(rng):
    op = tcc.compile(LINEAR, constant_params=["Wt"]).linear
    x, w, b = random_args(op.te, {"M": 64, "K": 128, "N": 96}, rng)
    _run(op, [x, w, b])
    kernel = op.kernel(op.bindings_for((x, w, b), {}))
    assert kernel.prepared is not None and len(kernel.prepared._made) == 1
    w2 = w + 1
    np.testing.assert_allclose(op(x, w2, b), x @ w2.T + b, rtol=1e-4, atol=1e-4)  # (no reference: it keeps w2)
    assert len(kernel.prepared._made) == 2
    del w2
    gc.collect()
    assert len(kernel.prepared._made) == 1  # the dropped array's buffers went with it
    _run(op, [x, w, b])


def test_constant_params_are_checked():
    with pytest.raises(TccArgumentError, match="no op takes as a tensor"):
        tcc.compile(LINEAR, constant_params=["W"])
    with pytest.raises(TccArgumentError, match="list of parameter names"):
        tcc.compile(LINEAR, constant_params="Wt")
    with pytest.raises(TccArgumentError, match="for target cpu"):
        tcc.compile(LINEAR, target="cuda", constant_params=["Wt"])


F32 = dtypes.f32


def _var(name: str) -> Var:
    return Var(name, dtypes.i64)


def _fill(buf: str, source: str) -> For:
    """``for i in 0..4: for j in 0..8: buf[j, i] = source[t * 4 + i, j]`` (t: a loop around)."""
    row = Binary("add", Binary("mul", _var("t"), Const(4, dtypes.i64), dtypes.i64), _var("i"), dtypes.i64)
    store = Store(buf, (_var("j"), _var("i")), Load(source, (row, _var("j")), F32))
    return For(_var("i"), Const(4, dtypes.i64), For(_var("j"), Const(8, dtypes.i64), store))


def _func(fill: For, reader: Store, read_first: bool = False) -> LoopFunc:
    params = [Buffer("W", F32, (12, 8)), Buffer("X", F32, (12, 8)), Buffer("Y", F32, (3, 8, 4))]
    read = For(_var("j"), Const(8, dtypes.i64), For(_var("i"), Const(4, dtypes.i64), reader))
    body = Allocate(Buffer("P", F32, (8, 4)), For(_var("t"), Const(3, dtypes.i64),
                                                Seq((read, fill, read) if read_first else (fill, read))))
    return LoopFunc("f", params, body)


def test_only_fills_of_constants_read_after_them_are_hoisted():
    reader = Store("Y", (_var("t"), _var("j"), _var("i")), Load("P", (_var("j"), _var("i")), F32))
    hoisted = hoist_constants(_func(_fill("P", "W"), reader), frozenset({"W"}))
    prepare = hoisted.attrs["prepare"]
    assert [p.name for p in prepare.params] == ["W", "P_prepared"]  # type: ignore[union-attr]
    assert hoisted.params[-1] == Buffer("P_prepared", F32, (3, 8, 4))  # one copy per t: the fill reads t
    assert not any(isinstance(s, Allocate) for s in walk_stmts(hoisted.body))
    assert {ld.buffer for ld in loads(hoisted.body)} == {"P_prepared"}
    assert hoist_constants(_func(_fill("P", "X"), reader), frozenset({"W"})).attrs == {}  # X is data
    assert hoist_constants(_func(_fill("P", "W"), reader), frozenset()).attrs == {}
    assert hoist_constants(_func(_fill("P", "W"), reader, read_first=True), frozenset({"W"})).attrs == {}
    fill = _fill("P", "W")  # ... * a: a runtime scalar of each call, no constant
    store = fill.body.body  # type: ignore[attr-defined]
    scaled = replace(fill, body=replace(fill.body, body=replace(store, value=Binary("mul", store.value, Var("a", F32),
                                                                                    F32))))
    assert hoist_constants(_func(scaled, reader), frozenset({"W"})).attrs == {}

