"""What Python says about a library and its ops: help(), __doc__, inspect.signature, repr, dir."""

import inspect
import pydoc

import numpy as np

import tcc

SOURCE = """
op scale[K = 2](X: f32[N], a: f32) -> Y: f32[N] { Y[i] = a * X[i] * K }

# Row-wise softmax.
# Subtracts the row's max first.
op softmax(X: f32[N, C])   # the input
    -> Y: f32[N, C] {
    m[n] = max[c](X[n, c])
    e[n, c] = exp(X[n, c] - m[n])
    s[n] = sum[c](e[n, c])
    Y[n, c] = e[n, c] / s[n]
}
"""


def test_doc_is_the_ops_header_and_comment():
    lib = tcc.compile(SOURCE)
    doc = lib.softmax.__doc__
    assert doc.startswith("op softmax(X: f32[N, C]) -> Y: f32[N, C]\n\n"
                          "Row-wise softmax.\nSubtracts the row's max first.\n")
    assert "softmax(X, /, *, out=None) -> Y" in doc
    assert "Row-wise" not in lib.scale.__doc__  # a blank line and a body separate it from the comment
    assert lib.scale.__doc__.startswith("op scale[K = 2](X: f32[N], a: f32) -> Y: f32[N]\n")
    assert tcc.Op.__doc__ not in doc


def test_help_shows_the_op_not_the_class():
    text = pydoc.render_doc(tcc.compile(SOURCE).softmax, renderer=pydoc.plaintext)
    assert "op softmax(X: f32[N, C]) -> Y: f32[N, C]" in text and "Row-wise softmax." in text
    assert "Methods defined here" not in text  # what help() prints for the generic class


def test_signature_binds_like_a_call():
    lib = tcc.compile(SOURCE)
    sig = inspect.signature(lib.scale)
    assert str(sig) == "(X, a, /, *, K=2, out=None)"
    bound = sig.bind(np.ones(3, np.float32), 2.0, K=3)
    assert lib.scale(*bound.args, **bound.kwargs).tolist() == [6.0, 6.0, 6.0]


def test_doc_of_a_scheduled_and_a_derived_op():
    lib = tcc.compile(SOURCE)
    assert lib.softmax.schedule("").__doc__ == lib.softmax.__doc__
    grad = tcc.grad(tcc.compile("examples/conv2d.tc").conv2d)
    assert grad.__doc__.startswith("op conv2d_grad[S = 1, P = 0, D = 1](")


def test_repr_and_dir():
    lib = tcc.compile(SOURCE)
    assert repr(lib) == "<tcc library on cpu: scale, softmax>"
    assert repr(tcc.compile("examples/softmax.tc")) == "<tcc library from examples/softmax.tc on cpu: softmax>"
    assert repr(lib.scale) == "<tcc op scale[K = 2](X: f32[N], a: f32) -> Y: f32[N] on cpu>"
    names = dir(lib)
    assert names.count("softmax") == 1 and names.count("scale") == 1 and "ops" in names
