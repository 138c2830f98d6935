"""Shape-generic kernels: ``tcc.compile(..., dynamic=...)`` and the automatic policy.

One compiled op called at sizes 1, 7, 33, 1000 and round ones matches the reference each time,
builds one kernel, and a new process finds it in the disk cache for any size.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tcc
from tcc.errors import TccIndexError
from tcc.testing import assert_matches, reference_results

SIZES = (1, 7, 33, 1000, 64)

ELEMENTWISE = """
op axpb(A: f32[S, N], B: f32[S, N]) -> C: f32[S, N] {
    C[i, j] = A[i, j] * 2.0 + B[i, j]
}
"""


def _check(op, args):
    """Run ``op`` into a NaN-poisoned ``out=`` and compare with the reference."""
    bindings = op.bind(args, {}).bindings
    want = reference_results(op.te, list(args), bindings)
    out = [np.full(w.shape, np.nan, w.dtype) for w in want]
    op(*args, out=out[0] if len(out) == 1 else tuple(out))
    for got, expected, name in zip(out, want, op.te.results):
        assert_matches(got, expected, op.te.tensors[name].dtype, name)


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_one_kernel_for_every_size(fresh_cache, rng):
    op = tcc.compile(ELEMENTWISE, dynamic=("S", "N")).axpb
    for n in SIZES:
        _check(op, (_f32(rng, n, n + 2), _f32(rng, n, n + 2)))
        got = op(_f32(rng, 3, n), _f32(rng, 3, n))  # and a plain call: results allocated at the call
        assert got.shape == (3, n)
    _check(op, (_f32(rng, 2048, 1024), _f32(rng, 2048, 1024)))  # 8 MiB: non-temporal stores at this size
    assert "C when at least" in op.lower(_f32(rng, 2, 2), _f32(rng, 2, 2), stage="scheduled") \
        or not op.target.avx512
    assert op.compiles == 1


@pytest.mark.parametrize("name, args", [
    ("softmax", lambda rng, n: (_f32(rng, n, n + 3),)),
    ("layernorm", lambda rng, n: (_f32(rng, n, n + 1), _f32(rng, n + 1), _f32(rng, n + 1))),
    ("matmul", lambda rng, n: (_f32(rng, n, n + 5), _f32(rng, n + 5, (n % 9) + 3))),
])
def test_rows_and_matmul(fresh_cache, rng, name, args):
    op = tcc.compile(f"examples/{name}.tc", dynamic=True)[name]
    for n in SIZES:
        _check(op, args(rng, n))
    assert op.compiles == 1


def test_the_kernel_takes_the_symbols_as_arguments(fresh_cache):
    op = tcc.compile(ELEMENTWISE, dynamic=("N",)).axpb
    a = np.ones((4, 70), np.float32)
    text = op.lower(a, a, stage="scheduled")
    assert "N: i64" in text and "S: i64" not in text  # S stays specialised (4)
    assert "N % 32" in text  # the vector loop's remainder, peeled


def test_a_declared_multiple_drops_the_tail(fresh_cache, rng):
    op = tcc.compile(ELEMENTWISE, dynamic={"N": 8}).axpb
    a = np.ones((2, 16), np.float32)
    assert "N % " not in op.lower(a, a, stage="scheduled")
    for n in (8, 24, 1000, 4096):
        _check(op, (_f32(rng, 5, n), _f32(rng, 5, n)))
    with pytest.raises(tcc.TccError, match="N of axpb is 12, not a multiple of 8"):
        op(np.ones((2, 12), np.float32), np.ones((2, 12), np.float32))
    assert op.compiles == 1


def test_automatic_policy_third_value_compiles_nothing(fresh_cache, rng):
    op = tcc.compile("examples/softmax.tc").softmax
    for n in (5, 6, 7, 300, 1):
        _check(op, (_f32(rng, n, 11),))
    assert op.compiles == 2  # N=5 specialised, then one kernel for every N


def test_dynamic_false_specialises_every_size(fresh_cache, rng):
    op = tcc.compile(ELEMENTWISE, dynamic=False).axpb
    for n in (1, 2, 3):
        _check(op, (_f32(rng, n, 4), _f32(rng, n, 4)))
    assert op.compiles == 3


def test_out_of_range_values_are_refused_with_the_symbol(fresh_cache):
    src = """
    op shift(X: f32[N], K: f32[M]) -> Y: f32[M] {
        Y[i] = X[i + 2]
    }
    """
    op = tcc.compile(src, dynamic=("N", "M")).shift
    y = op(np.arange(10, dtype=np.float32), np.zeros(8, np.float32))
    np.testing.assert_array_equal(y, np.arange(2, 10, dtype=np.float32))
    with pytest.raises(tcc.TccError, match=r"M=9, N=10 \(dynamic\).*X"):
        op(np.arange(10, dtype=np.float32), np.zeros(9, np.float32))


def test_bad_dynamic_arguments():
    with pytest.raises(tcc.TccError, match="dynamic= names Q"):
        tcc.compile(ELEMENTWISE, dynamic=("Q",))
    with pytest.raises(tcc.TccError, match="positive integer"):
        tcc.compile(ELEMENTWISE, dynamic={"N": 0})
    with pytest.raises(tcc.TccError, match="dynamic= must be"):
        tcc.compile(ELEMENTWISE, dynamic=3)


def test_a_new_process_finds_the_kernel_for_any_size(fresh_cache):
    script = textwrap.dedent(f"""
        import sys, numpy as np, tcc
        op = tcc.compile({ELEMENTWISE!r}, dynamic=True).axpb
        n = int(sys.argv[1])
        a = np.arange(3 * n, dtype=np.float32).reshape(3, n)
        assert np.array_equal(op(a, a), a * 3)
        print(op.compiles, op.loads)
    """)
    runs = [subprocess.run([sys.executable, "-c", script, str(n)], capture_output=True, text=True, check=True)
            for n in (5, 77)]
    assert [r.stdout.split() for r in runs] == [["1", "0"], ["0", "1"]]


@pytest.mark.parametrize("symbols", [("N",), ("N", "H", "W")])
def test_conv_batch_and_image_sizes(fresh_cache, rng, symbols):
    op = tcc.compile("examples/conv2d.tc", dynamic=symbols).conv2d
    for n, hw in ((1, 9), (3, 9), (2, 9), (7, 5) if len(symbols) > 1 else (7, 9)):
        args = (_f32(rng, n, 8, hw, hw), _f32(rng, 16, 8, 3, 3), _f32(rng, 16))
        bindings = op.bind(args, {"P": 1}).bindings
        want = reference_results(op.te, list(args), bindings)[0]
        out = np.full(want.shape, np.nan, np.float32)
        op(*args, out=out, P=1)
        assert_matches(out, want, op.te.tensors["Y"].dtype)
    assert op.compiles == 1


@pytest.mark.parametrize("pad", [1, 0])
def test_conv_image_size_tiles_and_tails(fresh_cache, rng, pad):
    """One kernel with the image size dynamic at sizes whose pixels fill whole cache blocks,
    whole register tiles, or leave a remainder of a few columns (the vector-padded tail: its
    gather, multiply-adds and bias epilogue), with the padding's masks at every border."""
    op = tcc.compile("examples/conv2d.tc", dynamic=("N", "H", "W")).conv2d
    for n, h, w in ((1, 7, 7), (1, 3, 3), (2, 33, 5), (1, 16, 16), (1, 28, 28), (1, 3, 100), (1, 40, 37)):
        args = (_f32(rng, n, 32, h, w), _f32(rng, 24, 32, 3, 3), _f32(rng, 24))
        bindings = op.bind(args, {"P": pad}).bindings
        want = reference_results(op.te, list(args), bindings)[0]
        out = np.full(want.shape, np.nan, np.float32)
        op(*args, out=out, P=pad)
        assert_matches(out, want, op.te.tensors["Y"].dtype)
    assert op.compiles == 1


ATTENTION = """
op attention(Q: f32[B, H, S, D], K: f32[B, H, L, D], V: f32[B, H, L, D], scale: f32) -> O: f32[B, H, S, D] {
    s[b, h, i, j] = sum[d](Q[b, h, i, d] * K[b, h, j, d]) * scale
    m[b, h, i] = max[j](s[b, h, i, j])
    e[b, h, i, j] = exp(s[b, h, i, j] - m[b, h, i])
    l[b, h, i] = sum[j](e[b, h, i, j])
    O[b, h, i, d] = sum[j](e[b, h, i, j] * V[b, h, j, d]) / l[b, h, i]
}
"""


def test_attention_streams_at_every_length(fresh_cache, rng):
    """One streaming kernel (nothing S x L stored) with the query and key lengths dynamic: a
    short last block of rows, a ragged last tile of keys, one ragged tile (70 keys), and the
    short tile of a few keys (1, 7, 33) in masked vectors."""
    op = tcc.compile(ATTENTION, dynamic=("S", "L")).attention
    for s, n in ((1, 1), (7, 33), (33, 7), (5, 70), (1000, 130), (64, 128), (130, 1000)):
        q, k, v = _f32(rng, 1, 2, s, 16), _f32(rng, 1, 2, n, 16), _f32(rng, 1, 2, n, 16)
        _check(op, (q, k, v, 0.25))
    assert op.lowered({"B": 1, "H": 2, "S": 5, "L": 5, "D": 16}).te.streams
    assert op.compiles == 1


SHIFT_SELECT = """
op prev(X: f32[N]) -> Y: f32[N] {
    Y[i] = select(i > 0, X[i - 1], 0.0)
}
"""
GATHER = """
op lookup(E: f32[V, D], idx: i64[T]) -> Y: f32[T, D] {
    Y[t, d] = E[idx[t], d]
}
"""


def test_reads_under_a_select_are_clamped_for_every_size(fresh_cache, rng):
    """``X[i - 1]`` is read only where ``i > 0``; both sides of the select may be computed, so the
    dynamic kernel clamps the read (N = 1 too: its one element reads nothing past X)."""
    op = tcc.compile(SHIFT_SELECT, dynamic=True).prev
    for n in SIZES:
        _check(op, (_f32(rng, n),))
    assert op.compiles == 1


def test_data_indices_are_checked_at_every_call_of_a_dynamic_kernel(fresh_cache, rng):
    """An index read from data is checked at the call (on the host, per binding), so a dynamic
    kernel serves every size: one kernel, and an index out of range is still a TccIndexError
    before anything is written."""
    def args(n):
        return (_f32(rng, 10, 4), rng.integers(0, 10, n))

    op = tcc.compile(GATHER, dynamic=True).lookup
    for n in (1, 7, 33, 5):
        _check(op, args(n))
    assert op.compiles == 1
    out = np.full((3, 4), np.nan, np.float32)
    with pytest.raises(TccIndexError, match=r"is 10 at t=1, outside \[0, 10\)"):
        op(_f32(rng, 10, 4), np.array([1, 10, 2]), out=out)
    assert np.isnan(out).all()
    automatic = tcc.compile(GATHER).lookup
    for n in (3, 4, 9):
        _check(automatic, args(n))
    assert automatic.compiles == 2


def test_gemm_with_an_epilogue_over_several_k_blocks(fresh_cache, rng):
    """Every symbol dynamic: remainder rows and columns, a reduction of one or more k blocks
    (the first of them perhaps the remainder), and the bias added after the GEMM."""
    src = """
    op linear(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C: f32[M, N] {
        C[i, j] = sum[k](A[i, k] * B[k, j]) + b[j]
    }
    """
    op = tcc.compile(src, dynamic=True).linear
    for m, n, k in ((3, 7, 2000), (66, 69, 62), (1, 1, 1), (64, 64, 1024)):
        _check(op, (_f32(rng, m, k), _f32(rng, k, n), _f32(rng, n)))
    assert op.compiles == 1


def test_torch_ops_one_kernel_for_every_batch():
    """``tcc.torch`` operators of a dynamic op: each size's repeat calls take the eager fast path
    (the Python one: the C++ one lays out no cells for the kernel's shape symbols)."""
    torch = pytest.importorskip("torch")
    ops = tcc.torch.library("examples/matmul.tc", namespace="tcc_test_dynamic", dynamic=("M",))
    w = torch.randn(33, 20)
    for m in (1, 7, 33, 1000, 7):
        for _ in range(3):
            a = torch.randn(m, 33)
            torch.testing.assert_close(ops.matmul(a, w), a @ w, rtol=1e-4, atol=1e-4)
    assert ops.matmul.op.compiles + ops.matmul.op.loads <= 1  # (0: another test's, in memory)


def test_a_declared_multiple_of_a_gemm_row_count(fresh_cache, rng):
    """dynamic={"M": 8} on a matmul: no remainder rows in the kernel, right at every multiple,
    one kernel; a row count that is no multiple is refused naming the symbol."""
    op = tcc.compile("examples/matmul.tc", dynamic={"M": 8}).matmul
    for m in (8, 40, 1024):
        _check(op, (_f32(rng, m, 33), _f32(rng, 33, 17)))
    assert "M % " not in op.lower(_f32(rng, 8, 33), _f32(rng, 33, 17), stage="scheduled")
    with pytest.raises(tcc.TccError, match="M of matmul is 12, not a multiple of 8"):
        op(_f32(rng, 12, 33), _f32(rng, 33, 17))
    assert op.compiles == 1
