"""ONNX ScatterElements and ScatterND (every reduction) as accumulating statements, and Range as
an index expression, against onnxruntime on random data at odd sizes; out-of-range indices are
a TccIndexError with out= untouched."""

from __future__ import annotations

import numpy as np
import pytest
from test_onnx import check_against_ort, make_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import tcc  # noqa: E402
from tcc.errors import TccIndexError  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _distinct(rng, n, count, negative=True):
    """``count`` distinct positions of an axis of ``n`` (reduction none: duplicates are undefined),
    a third of them counted from the end."""
    picked = rng.permutation(n)[:count]
    return picked - n * (rng.random(count) < 0.3) if negative else picked


def _scatter_model(op, data, ishape, ushape, **attrs):
    node = helper.make_node(op, ["x", "i", "u"], ["y"], **attrs)
    return make_model([node], [("x", F32, data), ("i", I64, ishape), ("u", F32, ushape)], [("y", F32, data)],
                      opset=18)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis,ishape", [(0, (3, 33)), (1, (7, 2)), (0, (2, 5)), (-1, (1, 1))])
def test_scatter_elements(rng, reduction, axis, ishape):
    data = (7, 33)
    n = data[axis]
    if reduction == "none":
        a = axis % 2
        lines = [_distinct(rng, n, ishape[a]) for _ in range(ishape[1 - a])]
        i = np.stack(lines, axis=1 - a)
    else:  # duplicates: each position gets every update that lands on it
        i = rng.integers(-n, n, ishape)
    feeds = {"x": rng.standard_normal(data).astype(np.float32), "i": i.astype(np.int64),
             "u": rng.standard_normal(ishape).astype(np.float32)}
    check_against_ort(_scatter_model("ScatterElements", data, ishape, ishape, axis=axis, reduction=reduction),
                      rng, feeds=feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ishape,ushape", [((2, 1), (2, 4, 3)), ((5, 2), (5, 3)), ((2, 2, 3), (2, 2)),
                                           ((1,), (4, 3))])
def test_scatter_nd(rng, reduction, ishape, ushape):
    data = (7, 4, 3)
    q, rows = ishape[-1], int(np.prod(ishape[:-1]))
    if reduction == "none":
        flat = _distinct(rng, int(np.prod(data[:q])), rows, negative=False)
        i = np.stack(np.unravel_index(flat, data[:q]), -1).reshape(ishape)
    else:
        i = np.stack([rng.integers(-data[c], data[c], ishape[:-1]) for c in range(q)], -1)
    feeds = {"x": rng.standard_normal(data).astype(np.float32), "i": i.astype(np.int64),
             "u": rng.standard_normal(ushape).astype(np.float32)}
    check_against_ort(_scatter_model("ScatterND", data, ishape, ushape, reduction=reduction), rng, feeds=feeds,
                      rtol=1e-5, atol=1e-6)


def test_scatter_add_is_an_accumulating_statement(rng):
    """The embedding-gradient pattern: one += over the updates, no masked sum over the table."""
    model = _scatter_model("ScatterND", (1000, 16), (33, 1), (33, 16), reduction="add")
    source = tcc.onnx.load(model).source
    assert "+=" in source and "sum[" not in source
    feeds = {"x": rng.standard_normal((1000, 16)).astype(np.float32),
             "i": rng.integers(0, 1000, (33, 1)).astype(np.int64),
             "u": rng.standard_normal((33, 16)).astype(np.float32)}
    check_against_ort(model, rng, feeds=feeds, rtol=1e-5, atol=1e-6)


def test_scatter_of_ints_and_bools(rng):
    for elem, dtype in ((I64, np.int64), (TensorProto.BOOL, np.bool_)):
        node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)
        model = make_model([node], [("x", elem, [5, 7]), ("i", I64, [5, 2]), ("u", elem, [5, 2])],
                           [("y", elem, [5, 7])], opset=18)
        i = np.stack([_distinct(rng, 7, 2) for _ in range(5)]).astype(np.int64)
        x, u = (rng.integers(-9, 9, s).astype(dtype) for s in ((5, 7), (5, 2)))
        check_against_ort(model, rng, feeds={"x": x, "i": i, "u": u})


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_out_of_range_is_an_index_error(rng, op, reduction):
    ishape = (3, 1) if op == "ScatterND" else (3, 4)
    ushape = (3, 4) if op == "ScatterND" else (3, 4)
    compiled = tcc.onnx.load(_scatter_model(op, (5, 4), ishape, ushape, reduction=reduction))
    x, u = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal(ushape).astype(np.float32)
    out = np.full((5, 4), 7.0, np.float32)
    for bad in (5, -6):
        i = np.zeros(ishape, np.int64)
        i[1, 0] = bad
        with pytest.raises(TccIndexError):
            compiled(x, i, u, out=out)
        assert np.all(out == 7.0)


@pytest.mark.parametrize("elem,start,limit,delta", [(F32, 1.0, 9.0, 0.5), (I64, 3, 40, 2), (I64, 10, -30, -3),
                                                    (F32, 0.0, 1.0, 1.0)])
def test_range_is_an_index_expression(rng, elem, start, limit, delta):
    """Range's scalars decide its length: given as inputs they are fixed by the call's values."""
    from tcc.interop.onnx_backend import TccBackend

    dtype = np.float32 if elem == F32 else np.int64
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Mul", ["x", "r"], ["y"])]
    model = make_model(nodes, [("x", elem, [1]), ("s", elem, []), ("l", elem, []), ("d", elem, [])],
                       [("y", elem, ["n"])])
    feeds = {"x": np.array([3], dtype), "s": np.array(start, dtype), "l": np.array(limit, dtype),
             "d": np.array(delta, dtype)}
    got = TccBackend.run_model(model, list(feeds.values()))[0]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, expected)
    compiled = tcc.onnx.load(model, constants={k: feeds[k] for k in "sld"})
    assert len(compiled.program.weights) == 0  # no stored array: an index expression


def test_scatter_in_a_chain(rng):
    """A scatter between two MatMuls and a Softmax: its tensor is added into, then read."""
    nodes = [helper.make_node("MatMul", ["x", "v"], ["a"]),
             helper.make_node("ScatterElements", ["a", "i", "u"], ["s"], axis=0, reduction="add"),
             helper.make_node("MatMul", ["s", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])]
    model = make_model(nodes, [("x", F32, [7, 33]), ("i", I64, [3, 33]), ("u", F32, [3, 33])], [("y", F32, [7, 5])],
                       {"v": rng.standard_normal((33, 33)).astype(np.float32),
                        "w": rng.standard_normal((33, 5)).astype(np.float32)}, opset=18)
    feeds = {"x": rng.standard_normal((7, 33)).astype(np.float32), "i": rng.integers(-7, 7, (3, 33)).astype(np.int64),
             "u": rng.standard_normal((3, 33)).astype(np.float32)}
    check_against_ort(model, rng, feeds=feeds, rtol=1e-5, atol=1e-5)


def test_constant_indices_out_of_range_are_an_import_error(rng):
    from tcc.interop.graph import OnnxImportError

    for op, i in (("ScatterElements", np.array([[0, 5]])), ("ScatterND", np.array([[1, 0], [2, 9]]))):
        node = helper.make_node(op, ["x", "i", "u"], ["y"])
        shape = [1, 2] if op == "ScatterElements" else [2]
        model = make_model([node], [("x", F32, [5, 4]), ("u", F32, shape)], [("y", F32, [5, 4])], {"i": i}, opset=18)
        with pytest.raises(OnnxImportError, match="out of range"):
            tcc.onnx.load(model)


def test_uniform_constant_indices(rng):
    """Indices that are one repeated constant (a literal in the source): the += still learns the
    ranges of its variables (fuzz seed 1: 'cannot infer the range of index')."""
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction="add")
    model = make_model([node], [("x", F32, [3, 5]), ("u", F32, [2, 5])], [("y", F32, [3, 5])],
                       {"i": np.zeros((2, 5), np.int64)}, opset=18)
    check_against_ort(model, rng, rtol=1e-5, atol=1e-6)
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"])
    model = make_model([node], [("x", F32, [3, 5]), ("u", F32, [1, 5])], [("y", F32, [3, 5])],
                       {"i": np.ones((1, 1), np.int64)}, opset=18)
    check_against_ort(model, rng)
