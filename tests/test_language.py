"""Language features on the CPU against the reference: dtypes, promotion, integer semantics,
reductions, pads, scalars, several results, intermediates, strides and out=."""

import numpy as np
import pytest
from helpers import check_op

import tcc


@pytest.mark.parametrize("n", [1, 7, 33, 1000])
def test_elementwise_math(n, rng):
    src = """
    op f(X: f32[N], Y: f32[N]) -> Z: f32[N] {
        Z[i] = (exp(X[i]) * sin(Y[i]) + tanh(X[i]) - sigmoid(Y[i]) + cos(X[i]) * abs(Y[i])
             + floor(X[i]) + ceil(Y[i]) + erf(X[i]) + sqrt(abs(X[i])) + log(abs(Y[i]) + 1.0)
             + rsqrt(abs(X[i]) + 1.0) + X[i] ** 2 + pow(abs(Y[i]), 0.5))
    }
    """
    check_op(src, "f", dict(N=n), rng)


@pytest.mark.parametrize("dtype", ["i8", "i32", "i64"])
def test_integer_floor_division_and_modulo(dtype, rng):
    src = f"""
    op f(A: {dtype}[N], B: {dtype}[N]) -> (Q: {dtype}[N], R: {dtype}[N]) {{
        Q[i] = A[i] // B[i]
        R[i] = A[i] % B[i]
    }}
    """
    a = rng.integers(-50, 50, 101).astype(dtype.replace("i", "int"))
    b = rng.integers(-7, 8, 101).astype(dtype.replace("i", "int"))  # includes zero divisors
    q, r = check_op(src, "f", dict(N=101), rng, args=[a, b])
    nz = b != 0
    np.testing.assert_array_equal(q[nz], a[nz] // b[nz])
    np.testing.assert_array_equal(r[nz], a[nz] % b[nz])
    assert (q[~nz] == 0).all() and (r[~nz] == 0).all()


def test_python_floor_semantics_of_constants():
    lib = tcc.compile("op f(X: i32[N]) -> Y: i32[N] { Y[i] = X[i] * 0 + (-7 // 2) * 10 + (-7 % 2) }")
    assert lib.f(np.zeros(3, np.int32)).tolist() == [-39, -39, -39]


def test_float_floor_division_and_modulo(rng):
    src = "op f(A: f64[N], B: f64[N]) -> (Q: f64[N], R: f64[N]) { Q[i] = A[i] // B[i]; R[i] = A[i] % B[i] }"
    check_op(src, "f", dict(N=57), rng)


def test_integer_division_gives_float(rng):
    src = "op f(A: i32[N], B: i32[N]) -> C: f64[N] { C[i] = A[i] / (abs(B[i]) + 1) }"
    check_op(src, "f", dict(N=20), rng)


def test_promotion_follows_numpy():
    lib = tcc.compile("""
    op f(A: f16[N], B: i32[N]) -> (C: f64[N], D: f32[N], E: f16[N]) {
        C[i] = A[i] + B[i]
        D[i] = f32(A[i]) * 2
        E[i] = A[i] * 0.5
    }
    """)
    te = lib.f.te
    assert te.computes[0].body.a.dtype.name == "f64"  # f16 + i32 -> f64 as in NumPy
    a = np.arange(5, dtype=np.float16)
    c, d, e = lib.f(a, np.arange(5, dtype=np.int32))
    np.testing.assert_array_equal(c, a.astype(np.float64) + np.arange(5))
    np.testing.assert_array_equal(e, a * np.float16(0.5))


def test_symbols_as_values_stay_weak():
    lib = tcc.compile("op mean(X: f32[N, D]) -> Y: f32[N] { Y[n] = sum[d](X[n, d]) / D }")
    assert lib.mean.te.computes[0].body.dtype.name == "f32"


@pytest.mark.parametrize("red", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "f16"])
def test_reductions(red, dtype, rng):
    result = dtype if red in ("max", "min") or dtype[0] == "f" else "i64"
    body = "X[n, c] * 0.5 + 1.0" if (red == "prod" and dtype[0] == "f") else "X[n, c]"
    src = f"op r(X: {dtype}[N, C]) -> Y: {result}[N] {{ Y[n] = {red}[c]({body}) }}"
    check_op(src, "r", dict(N=7, C=9 if red == "prod" else 33), rng)


def test_multi_axis_reduction_with_explicit_extents(rng):
    src = """
    op box[K = 3](X: f32[N, H]) -> Y: f32[N, H - K + 1] {
        Y[n, y] = sum[r: K, s: 2](X[n, y + r] * f32(s + 1))
    }
    """
    check_op(src, "box", dict(N=4, H=11, K=3), rng)
    check_op(src, "box", dict(N=1, H=5, K=5), rng)


def test_pad_with_value_and_high_side(rng):
    src = """
    op p(X: f32[H, W]) -> Y: f32[H + 3, W + 1] {
        Xp = pad(X, [1, 0], [2, 1], value=-1.5)
        Y[i, j] = Xp[i, j] * 2.0
    }
    """
    (y,) = check_op(src, "p", dict(H=5, W=4), rng)
    assert (y[0] == -3.0).all() and (y[:, -1] == -3.0).all()


def test_scalars_and_several_results(rng):
    src = """
    op two(a: f32, k: i32, X: f32[N]) -> (Y: f32[N], Z: i32[N]) {
        Y[i] = a * X[i]
        Z[i] = i32(i) * k
    }
    """
    lib = tcc.compile(src)
    x = rng.standard_normal(9).astype(np.float32)
    y, z = lib.two(2.5, 3, x)
    np.testing.assert_allclose(y, 2.5 * x, rtol=1e-6)
    assert z.tolist() == [3 * i for i in range(9)]


def test_comparisons_logic_and_select(rng):
    src = """
    op s(X: f32[N], Y: f32[N]) -> (Z: f32[N], B: bool[N]) {
        Z[i] = select(X[i] > Y[i] and not (X[i] > 1.0), X[i], -Y[i])
        B[i] = X[i] <= 0.0 or Y[i] == Y[i]
    }
    """
    check_op(src, "s", dict(N=33), rng)


def test_bool_inputs(rng):
    src = "op b(M: bool[N], X: f32[N]) -> Y: f32[N] { Y[i] = select(M[i], X[i], 0.0) }"
    check_op(src, "b", dict(N=17), rng)


def test_intermediates_shape_inference_and_declaration(rng):
    src = """
    op chain(X: f32[N, C]) -> Y: f32[N] {
        t[n, c] = X[n, c] * 2.0
        u: f32[N]
        u[n] = sum[c](t[n, c])
        Y[n] = u[n] + 1.0
    }
    """
    check_op(src, "chain", dict(N=5, C=6), rng)


def test_non_contiguous_and_strided_inputs(rng):
    lib = tcc.compile("op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }")
    a = rng.standard_normal((20, 30)).astype(np.float32)
    b = rng.standard_normal((40, 16)).astype(np.float32)
    a_view, b_view = a.T[::2], b[::-2, ::2]  # transposed, reversed, strided
    np.testing.assert_allclose(lib.mm(a_view, b_view), a_view @ b_view, rtol=1e-4, atol=1e-4)


def test_out_aliasing_an_input_gives_the_right_answer(rng):
    lib = tcc.compile("op mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] { C[i, j] = sum[k](A[i, k] * B[k, j]) }")
    a = rng.standard_normal((8, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    expected = a @ b
    lib.mm(a, b, out=a)
    np.testing.assert_allclose(a, expected, rtol=1e-4, atol=1e-5)


def test_out_non_contiguous(rng):
    lib = tcc.compile("op neg(X: f32[N, M]) -> Y: f32[N, M] { Y[i, j] = -X[i, j] }")
    x = rng.standard_normal((6, 5)).astype(np.float32)
    out = np.zeros((5, 6), np.float32).T
    lib.neg(x, out=out)
    np.testing.assert_array_equal(out, -x)


def test_empty_tensors():
    lib = tcc.compile("op s(X: f32[N, C]) -> Y: f32[N] { Y[n] = sum[c](X[n, c]) }")
    assert lib.s(np.zeros((0, 3), np.float32)).shape == (0,)
    np.testing.assert_array_equal(lib.s(np.ones((2, 0), np.float32)), [0.0, 0.0])


def test_casts_between_all_cpu_dtypes(rng):
    src = """
    op c(X: f32[N]) -> (A: i8[N], B: i32[N], C: i64[N], D: f16[N], E: f64[N], F: bool[N]) {
        A[i] = i8(X[i] * 10.0)
        B[i] = i32(X[i] * 1000.0)
        C[i] = i64(X[i] * 100000.0)
        D[i] = f16(X[i])
        E[i] = f64(X[i])
        F[i] = bool(X[i])
    }
    """
    # quarter-integers plus 1/8: every product is exact in f32 and f64 alike, so truncation agrees
    x = (rng.integers(-100, 100, 64) / 4 + 0.125).astype(np.float32)
    x[:3] = [0.0, -0.0, 0.125]
    check_op(src, "c", dict(N=64), rng, args=[x])


def test_comments_semicolons_and_bracketed_newlines(rng):
    src = """
    # leading comment
    op f(
        X: f32[N],   # a comment in the header
        Y: f32[N]
    ) -> Z: f32[N] {
        t[i] = X[i] +
        # not the end: still inside the line? no -- newline ends statements outside brackets
        0.0; u[i] = (Y[i]
                     * 2.0)
        Z[i] = t[i] + u[i]  # trailing comment
    }
    """
    with pytest.raises(tcc.TccError):
        tcc.compile(src)  # `X[i] +` then newline: the statement ends, which is a syntax error
    ok = src.replace("X[i] +\n", "(X[i] +\n").replace("0.0; u", "0.0); u")
    check_op(ok, "f", dict(N=10), rng)


def test_integer_power_and_neg_constant_power_error(rng):
    lib = tcc.compile("op p(X: i64[N]) -> Y: i64[N] { Y[i] = X[i] ** 3 + 2 ** 10 }")
    x = np.arange(-5, 6, dtype=np.int64)
    np.testing.assert_array_equal(lib.p(x), x ** 3 + 1024)
    with pytest.raises(tcc.TccError, match="negative integer powers"):
        tcc.compile("op p(X: i64[N]) -> Y: i64[N] { Y[i] = X[i] ** -1 }")


def test_nan_propagates_through_max(rng):
    lib = tcc.compile("op m(X: f32[N]) -> (Y: f32[N], Z: f32[1]) {\n"
                      "    Y[i] = max(X[i], 0.0); Z[j] = max[i](X[i]) + f32(j)\n}")
    x = np.array([1.0, np.nan, -2.0], np.float32)
    y, z = lib.m(x)
    assert np.isnan(y[1]) and y[0] == 1.0 and y[2] == 0.0
    assert np.isnan(z[0])


class _DLPackOnly:
    """An array-like that offers only DLPack, as a framework tensor would."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class _ArrayOnly:
    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array


def test_dlpack_and_array_interface_inputs(rng):
    lib = tcc.compile("op add(X: f32[N], Y: f32[N]) -> Z: f32[N] { Z[i] = X[i] + Y[i] }")
    x = rng.standard_normal(11).astype(np.float32)
    y = rng.standard_normal(11).astype(np.float32)
    np.testing.assert_array_equal(lib.add(_DLPackOnly(x), _ArrayOnly(y)), x + y)
