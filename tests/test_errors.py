"""Every error path: a TccError naming the place (file:line:col, the line, a caret) and what to do."""

import numpy as np
import pytest

import tcc
from tcc.errors import (
    TccArgumentError,
    TccBoundsError,
    TccCompileError,
    TccNameError,
    TccShapeError,
    TccSyntaxError,
    TccTypeError,
)

MATMUL = "op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n    C[i, j] = sum[k](A[i, k] * B[k, j])\n}\n"


def raises(exc_type, source, match):
    with pytest.raises(exc_type, match=match) as info:
        tcc.compile(source)
    return str(info.value)


def test_syntax_error_points_at_the_token():
    text = raises(TccSyntaxError, "op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i] +* 2\n}", "unexpected '\\*'")
    assert "<string>:2:18" in text
    assert "    Y[i] = X[i] +* 2" in text and "^" in text


def test_syntax_error_at_end_of_file():
    raises(TccSyntaxError, "op f(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i]", "unexpected end of file")


def test_unexpected_character():
    raises(TccSyntaxError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] $ 2 }", "unexpected character '\\$'")


def test_unknown_tensor_suggests_a_name():
    text = raises(TccNameError, "op f(Xs: f32[N]) -> Y: f32[N] { Y[i] = X[i] }", "unknown tensor 'X'")
    assert "did you mean 'Xs'" in text


def test_unknown_function():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = expp(X[i]) }", "unknown function 'expp'")


def test_unknown_name_in_expression():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * alpha }", "unknown name 'alpha'")


def test_result_never_assigned():
    raises(TccNameError, "op f(X: f32[N]) -> (Y: f32[N], Z: f32[N]) { Y[i] = X[i] }", "result 'Z' is never assigned")


def test_tensor_assigned_twice():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[i]; Y[i] = 2.0 }", "exactly one statement")


def test_input_is_read_only():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[N] { X[i] = 1.0; Y[i] = X[i] }", "read-only")


def test_read_before_defined():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = t[i]; t[i] = X[i] }", "unknown tensor 't'")


def test_left_hand_indices_must_be_plain():
    raises(TccSyntaxError, "op f(X: f32[N]) -> Y: f32[N] { Y[i + 1] = X[i] }", "plain index variables")


def test_float_stored_into_int_needs_a_cast():
    raises(TccTypeError, "op f(X: f32[N]) -> Y: i32[N] { Y[i] = X[i] * 2.0 }", "must be stored as i32")


def test_float_index():
    raises(TccTypeError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = X[f32(i)] }", "integer expression")


def test_rank_mismatch_in_read():
    raises(TccShapeError, "op f(X: f32[N, M]) -> Y: f32[N] { Y[i] = X[i] }", "rank 2")


def test_reduction_range_cannot_be_inferred():
    text = raises(TccShapeError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = sum[k](X[i] * f32(k)) }",
                  "range of reduction index 'k'")
    assert "sum[k: EXTENT]" in text


def test_intermediate_range_cannot_be_inferred_asks_for_declaration():
    text = raises(TccShapeError, "op f(X: f32[N]) -> Y: f32[N] { t[i, j] = X[i] * 2.0; Y[i] = t[i, 0] }",
                  "range of index 'j' of t")
    assert "declare" in text


def test_logic_needs_bools():
    raises(TccTypeError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = select(X[i] and X[i], 1.0, 0.0) }", "needs a bool")


def test_wrong_arity_of_a_call():
    raises(TccTypeError, "op f(X: f32[N]) -> Y: f32[N] { Y[i] = exp(X[i], X[i]) }", "takes 1 argument")


def test_reduction_written_as_a_call():
    raises(TccSyntaxError, "op f(X: f32[N]) -> Y: f32[1] { Y[j] = sum(X[j]) }", "needs its indices")


def test_duplicate_op():
    raises(TccNameError, MATMUL + MATMUL, "defined twice")


def test_result_dims_must_be_shape_expressions():
    raises(TccNameError, "op f(X: f32[N]) -> Y: f32[Q] { Y[i] = 1.0 }", "unknown name 'Q'")


def test_out_of_bounds_read_is_refused_at_compile_time():
    lib = tcc.compile("op shift(X: f32[N]) -> Y: f32[N] {\n    Y[i] = X[i + 1]\n}")
    with pytest.raises(TccBoundsError, match=r"index 0 of X \(i \+ 1\) takes values in \[1, 5\]") as info:
        lib.shift(np.zeros(5, np.float32))
    assert "<string>:2:12" in str(info.value) and "pad" in str(info.value)


def test_conv_without_padding_is_in_bounds_but_bigger_window_is_not():
    lib = tcc.compile("op c(X: f32[N]) -> Y: f32[N - 2] { Y[i] = sum[r: 4](X[i + r]) }")
    with pytest.raises(TccBoundsError):
        lib.c(np.zeros(10, np.float32))


# ---------------------------------------------------------------- calls

@pytest.fixture(scope="module")
def mm():
    return tcc.compile(MATMUL).matmul


def test_wrong_argument_count(mm):
    with pytest.raises(TccArgumentError, match="takes 2 argument"):
        mm(np.zeros((2, 2), np.float32))


def test_wrong_dtype_names_argument_and_fix(mm):
    with pytest.raises(TccArgumentError, match="argument A of matmul must be f32, got float64") as info:
        mm(np.zeros((2, 2)), np.zeros((2, 2), np.float32))
    assert "astype(np.float32)" in str(info.value) and "<string>:1:11" in str(info.value)


def test_wrong_rank(mm):
    with pytest.raises(TccArgumentError, match="rank 2"):
        mm(np.zeros(4, np.float32), np.zeros((4, 2), np.float32))


def test_symbol_bound_to_two_sizes(mm):
    with pytest.raises(TccShapeError, match=r"symbol K is 3 from A \(dim 1\) but 4 from B \(dim 0\)"):
        mm(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32))


def test_bad_out_changes_nothing(mm):
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 4), np.float32)
    out = np.full((2, 5), 7.0, np.float32)
    with pytest.raises(TccArgumentError, match="out= for C must be f32\\[2, 4\\]"):
        mm(a, b, out=out)
    assert (out == 7.0).all()


def test_unknown_compile_time_parameter():
    lib = tcc.compile("op f[S = 1](X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * f32(S) }")
    with pytest.raises(TccArgumentError, match="no compile-time parameter 'T'"):
        lib.f(np.zeros(3, np.float32), T=2)
    with pytest.raises(TccArgumentError, match="must be an integer"):
        lib.f(np.zeros(3, np.float32), S=1.5)


def test_scalar_of_wrong_kind():
    lib = tcc.compile("op f(k: i32, X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * f32(k) }")
    with pytest.raises(TccArgumentError, match="must be a i32 scalar"):
        lib.f(1.5, np.zeros(3, np.float32))


def test_result_shape_negative():
    lib = tcc.compile("op c(X: f32[N]) -> Y: f32[N - 2] { Y[i] = X[i] + X[i + 2] }")
    with pytest.raises(TccShapeError, match="dim 0 = -1"):
        lib.c(np.zeros(1, np.float32))


def test_bf16_on_cpu_is_refused_clearly():
    lib = tcc.compile("op f(X: f32[N]) -> Y: f32[N] { t[i] = bf16(X[i]); Y[i] = f32(t[i]) }")
    with pytest.raises(TccCompileError, match="bf16 is supported on target='cuda' only"):
        lib.f(np.zeros(3, np.float32))


def test_unknown_op_attribute():
    lib = tcc.compile(MATMUL)
    with pytest.raises(AttributeError, match="no op 'matmull'"):
        getattr(lib, "matmull")  # noqa: B009 - the attribute access is what is tested


def test_unknown_stage(mm):
    with pytest.raises(TccArgumentError, match="unknown stage 'llvmir'"):
        mm.lower(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32), stage="llvmir")


def test_unknown_target():
    with pytest.raises(TccArgumentError, match="unknown target"):
        tcc.compile(MATMUL, target="tpu")


def test_missing_file():
    with pytest.raises(tcc.TccError, match="file not found: no/such/file.tc"):
        tcc.compile("no/such/file.tc")


def test_negative_pad_width():
    lib = tcc.compile("op p[P = 1](X: f32[N]) -> Y: f32[N] { Xp = pad(X, [P - 2]); Y[i] = Xp[i] }")
    with pytest.raises(TccShapeError, match="pad Xp has a negative width"):
        lib.p(np.zeros(4, np.float32))
