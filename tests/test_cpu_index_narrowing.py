"""Floor division / modulo of i64 index lanes by a constant is done on i32 lanes where the
dividend provably fits (codegen_cpu/llvm_math.py: ``index_range``): the im2col gather's per-lane
row and column. Checked on convolutions at odd sizes against PyTorch, and the range reasoning
on its own, including where it must refuse."""

from pathlib import Path

import numpy as np
import pytest

import tcc
from tcc import dtypes
from tcc.codegen_cpu.llvm_math import index_range
from tcc.ir.expr import Binary, Const, Var

torch = pytest.importorskip("torch")
CONV = (Path(__file__).resolve().parent.parent / "examples" / "conv2d.tc").read_text()
I64 = dtypes.i64


def _v(name: str) -> Var:
    return Var(name, I64)


def _c(value: int) -> Const:
    return Const(value, I64)


def _b(op: str, a, b) -> Binary:
    return Binary(op, a, b, I64)


@pytest.mark.parametrize(("shape", "filters", "cparams"), [
    ((1, 64, 56, 56), 64, {"P": 1}),
    ((1, 5, 13, 11), 7, {"P": 1}),
    ((2, 3, 33, 17), 9, {"P": 2, "S": 2}),
    ((1, 1, 7, 1), 1, {"P": 1}),
])
def test_convolutions_match_torch(rng, shape, filters, cparams):
    op = tcc.compile(CONV).conv2d
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((filters, shape[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(filters).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                      stride=cparams.get("S", 1), padding=cparams["P"]).numpy()
    out = np.full(want.shape, np.nan, dtype=np.float32)
    op(x, w, b, out=out, **cparams)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_index_range_follows_loop_extents():
    flat = _b("add", _b("mul", _v("jo"), _c(32)), _v("jj"))  # jo in [0, 49), jj in [0, 16)
    extents = {"jo": 49, "jj": 16}
    assert index_range(flat, extents) == (0, 48 * 32 + 15)
    assert index_range(_b("floordiv", flat, _c(56)), extents) == (0, (48 * 32 + 15) // 56)
    assert index_range(_b("mod", flat, _c(56)), extents) == (0, 55)
    assert index_range(_b("sub", _v("jj"), _c(1)), extents) == (-1, 14)
    assert index_range(_b("floordiv", _b("sub", _v("jj"), _c(20)), _c(3)), extents) == (-7, -2)


def test_index_range_refuses_what_it_cannot_bound():
    assert index_range(_b("add", _v("jj"), _v("n")), {"jj": 16}) is None  # n: a parameter
    assert index_range(_b("floordiv", _v("jj"), _v("jj")), {"jj": 16}) is None  # not a constant divisor
    big = _b("mul", _v("i"), _c(1 << 20))
    lo, hi = index_range(big, {"i": 1 << 12})
    assert hi > (1 << 31)  # beyond i32: the code generator keeps such lanes in i64
